"""``python -m gpumem_nb`` or the ``gpumem-nb`` command: the snapshot table in a terminal, once
or every few seconds."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict

from .sampler import check_interval
from .sources.live import LiveSource
from .views import take

__all__ = ["main"]


def prog_name(argv0: str | None = None) -> str:
    """The name usage lines show: the command as it was typed (``gpumem-nb``), or ``python -m
    gpumem_nb`` when run as a module (argv[0] is then this file's path)."""
    name = os.path.basename(sys.argv[0] if argv0 is None else argv0)
    if not name or name in ("__main__.py", "-c", "-m") or name.endswith(".py"):
        return "python -m gpumem_nb"
    return name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=prog_name(),
        description="GPU memory as NVML and PyTorch's allocator see it, plus host RAM.",
    )
    parser.add_argument("--json", action="store_true", help="print the raw reading as JSON")
    parser.add_argument("--watch", type=float, metavar="S", help="repeat every S seconds")
    args = parser.parse_args(argv)
    if args.watch is not None:
        try:
            check_interval(args.watch)
        except ValueError as e:
            parser.error(str(e))
    source = LiveSource()
    try:
        while True:
            snap = take(source)
            if args.json:
                print(json.dumps({"status": asdict(snap.status), "sample": asdict(snap.sample)}))
            else:
                print(snap, flush=True)
            if args.watch is None:
                return 0
            time.sleep(args.watch)
            print()
    except KeyboardInterrupt:
        return 0
    finally:
        source.close()


if __name__ == "__main__":
    sys.exit(main())
