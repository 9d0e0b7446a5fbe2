"""``python -m gpumem_nb``: the snapshot table in a terminal, once or every few seconds."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict

from .sampler import check_interval
from .sources.live import LiveSource
from .views import take

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpumem_nb",
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
