"""``whatif`` and ``record``: replay an allocation history under other allocator settings,
and record the whole session's for it."""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from typing import Any

from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.display import display

from ...kernel import Monitor
from ...units import format_bytes, quoted
from ..grammar import Parser, Subcommand, size_flag

__all__ = ["RECORD", "WHATIF"]



def _whatif_flags(wi: Parser) -> None:
    wi.add_argument("--trace", metavar="last|FILE", default="last",
                    help="the history: the last cell traced with --trace, or a snapshot file")
    wi.add_argument("--conf", metavar="SETTING", action="append",
                    help="a PYTORCH_ALLOC_CONF setting to try (repeat; default: a few "
                         "alternatives)")
    wi.add_argument("--capacity", metavar="SIZE",
                    help="judge OOMs at this size (default: what was free to PyTorch)")
    wi.add_argument("--device", type=int, metavar="N",
                    help="which GPU's history (default: the one with the most entries)")
    wi.add_argument("--session", action="store_true",
                    help="replay everything since %%gpumem record on, from its start: what "
                         "restarting the kernel under each setting would do")
    wi.add_argument("--fit", nargs="?", const="", default=None, metavar="GB",
                    help="also the smallest GPU memory each setting needs (and, given GB, "
                         "the cheapest setting that fits that size)")
    wi.add_argument("--gpu", metavar="SIZE",
                    help="the GPU's memory, for a file that does not say it (_dump_snapshot's), "
                         "such as 80GiB (80GB is 80e9 bytes): models "
                         "per_process_memory_fraction and garbage_collection_threshold")
    wi.add_argument("-o", action="store_true", help="return the result object")


def _history(m: Monitor, args: argparse.Namespace) -> tuple[Any, tuple[str, ...]]:
    """The history to replay (a snapshot or a file's path), and the notes it comes with."""
    if args.session:
        if args.trace != "last":
            raise UsageError("--session replays the session recording: leave --trace out")
        got = m.session_recorder().snapshot()
        if got is None:
            raise UsageError("no session recording: switch it on with %gpumem record on, "
                             "run the cells, then %gpumem whatif --session")
        return got.snapshot, got.notes
    if args.trace == "last":
        last = m.last_trace
        source = last.snapshot if last is not None else None
        if source is None:
            raise UsageError("no traced cell to replay yet: run a cell under %%gpumem "
                             "--trace first, or name a snapshot file with --trace FILE")
        return source, ()
    return os.path.expanduser(args.trace), ()  # as --save's file is


def _gpu_bytes(text: str, most: int) -> int:
    from ...whatif import api as wi

    total = size_flag("--gpu", text, most)
    if not wi.plausible_gpu_bytes(total):
        # "--gpu 80", written as --fit 80 is, is 80 bytes: every row would run out.
        raise UsageError(f"--gpu is the GPU's memory with its unit, such as 80GiB; "
                         f"{quoted(text)} is {format_bytes(total)}")
    return total


def _fit_gb(text: str) -> float:
    from ...whatif import api as wi

    try:
        fit_gb = float(text.strip().upper().removesuffix("GB").strip())
        wi.check_fit(fit_gb)
    except (ValueError, wi.SettingError):
        raise UsageError(f"--fit takes a GPU size in GB from {wi.MIN_FIT_GB} to "
                         f"{wi.MAX_FIT_GB}, such as 40, not {quoted(text)}") from None
    return fit_gb


def _trace_input(source: Any, args: argparse.Namespace) -> Any:
    from ...whatif import api as wi

    try:
        return wi.trace_input(wi.load(source), args.device)
    except wi.NoHistory as e:
        if args.session:
            raise UsageError("the session recording holds no allocation yet") from None
        if args.trace != "last":
            raise UsageError(str(e)) from None
        raise UsageError("the last traced cell made no allocation on the GPU: there is "
                         "nothing to replay") from None
    except wi.SnapshotError as e:
        raise UsageError(str(e)) from None


def _settings(confs: list[str], recorded: str) -> list[Any]:
    """The settings to replay under: the recorded one first, then each of ``confs`` unless
    it has the same rules as one before it."""
    from ...whatif import api as wi

    parsed = []
    current = wi.parse_settings_or_none(recorded)
    if current is not None:
        parsed.append(current)
    for conf in confs:
        try:
            s = wi.parse_settings(conf)
        except wi.SettingError as e:
            # The reason names the part it refuses, quoted: a long value once, not twice.
            where = f"--conf {quoted(conf)}" if len(conf) <= 60 else "--conf"
            raise UsageError(f"{where}: {e}") from None
        if not any(wi.same_rules(s, p) for p in parsed):
            parsed.append(s)
    return parsed


def _not_pytorchs_bytes(m: Monitor, device: int, *,
                        this_process: bool) -> tuple[int | None, int | None]:
    """What PyTorch cannot reserve on ``device``, read now: the driver's own reserve (NVML v2),
    and where the replayed work is ``this_process``'s, its memory outside PyTorch's cache (its
    CUDA context and libraries). None for each NVML does not give."""
    try:
        d = m.read().device(device)
    except Exception:
        return None, None
    if d is None:
        return None, None
    reserve = d.nvml.driver_reserved_bytes if d.nvml is not None else None
    return (d.outside_pytorch_bytes if this_process else None), reserve


def whatif(m: Monitor, shell: InteractiveShell, args: argparse.Namespace) -> Any:
    from ...whatif import api as wi

    source, extra_notes = _history(m, args)
    capacity = None if args.capacity is None else \
        size_flag("--capacity", args.capacity, wi.MAX_CAPACITY_BYTES)
    total = None if args.gpu is None else _gpu_bytes(args.gpu, wi.MAX_CAPACITY_BYTES)
    fit_gb = _fit_gb(args.fit) if args.fit else None
    if args.device is not None and args.device < 0:
        raise UsageError("--device takes a GPU number")
    ti = _trace_input(source, args)
    parsed = _settings(args.conf if args.conf else list(wi.DEFAULT_ALTERNATIVES),
                       ti.recorded_setting)
    if extra_notes:
        ti = replace(ti, notes=(*ti.notes, *extra_notes))
    context = reserve = None
    if args.fit is not None:
        context, reserve = _not_pytorchs_bytes(
            m, ti.device, this_process=bool(args.session or args.trace == "last"))
    result = wi.run(ti, parsed, capacity, fit=args.fit is not None, fit_gb=fit_gb,
                    total_bytes=total, context_bytes=context, reserve_bytes=reserve,
                    progress=wi.Progress(display))
    if args.o:
        return result
    display(*wi.views(result))
    return None


WHATIF = Subcommand(
    "whatif", "replay a traced cell's allocations under other allocator settings:\n"
              "peak and end reserved, stranded bytes, cudaMalloc/cudaFree calls, OOM",
    _whatif_flags, whatif)


def _record_flags(rec: Parser) -> None:
    rec.add_argument("state", nargs="?", choices=("on", "off", "status"), default="status")
    rec.add_argument("--start-cuda", action="store_true",
                     help="with CUDA not started yet: start it now and record from an empty GPU")
    rec.add_argument("--max-entries", type=int, metavar="N",
                     help="allocator events kept at most (100000, at most 1000000; older "
                          "ones are dropped)")


def record(m: Monitor, shell: InteractiveShell, args: argparse.Namespace) -> None:
    # Kept on the monitor, as last_trace is; unloading the extension ends it.
    rec = m.session_recorder()
    from ...session import max_entries_refusal

    refusal = max_entries_refusal(args.max_entries, rec, args.state == "on")
    if refusal:
        raise UsageError(refusal)
    if args.state == "on":
        print(rec.start(start_cuda=args.start_cuda, max_entries=args.max_entries))
    elif args.state == "off":
        print(rec.stop())
    else:
        print(rec.status())


RECORD = Subcommand(
    "record", "record the allocator's history for the whole session (for "
              "%gpumem whatif --session)", _record_flags, record)
