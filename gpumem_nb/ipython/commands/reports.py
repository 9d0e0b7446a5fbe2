"""``%gpumem`` (``status``), ``summary``, ``oom`` and ``history``: what the GPUs, the
allocator and the cells show, read on demand."""

from __future__ import annotations

import argparse
import importlib.util
import os
from dataclasses import replace
from typing import Any

from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.display import display

from ... import safeio
from ...kernel import Monitor
from ...oom import with_counted_ooms
from ...records import HistoryTable
from ...summary import Summary
from ...units import quoted
from ...views import Snapshot
from ..grammar import Parser, Subcommand

__all__ = ["HISTORY", "HISTORY_ROWS", "OOM", "STATUS", "SUMMARY"]

# %gpumem history shows this many recent cells unless -n says otherwise.
HISTORY_ROWS = 20


def _no_flags(p: Parser) -> None:
    pass


def status(m: Monitor, shell: InteractiveShell, args: argparse.Namespace) -> None:
    st = m.status()
    m.learn_child_roles()
    sample = m.read()
    notes = [f"gpumem: {m.read_problem}"] if m.read_problem else []
    count, last_error = m.sampler_errors()
    if count:  # logged once when they happened; shown here while they last
        notes.append(f"The sampler hit {count} error(s); the last: {last_error[:300]}")
    if m.cuda_start_line():
        notes.append(m.cuda_start_line())
    notes.append(m.observer_line(st.has_gpu))
    st = replace(st, notes=(*st.notes, *notes))
    display(Snapshot(status=st, sample=sample))


STATUS = Subcommand(
    "status", "status of every GPU (the same as a bare %gpumem): NVML used/total, this "
              "process,\nallocated, reserved, peak, outside PyTorch, other processes",
    _no_flags, status)


def _history_flags(h: Parser) -> None:
    h.add_argument("-n", type=int, help="how many recent cells to show (20; with -o: all)")
    h.add_argument("-o", action="store_true",
                   help="return a DataFrame (pandas) instead, of the last -n cells if given")
    h.add_argument("--csv", metavar="FILE", help="write the whole history as CSV")
    h.add_argument("--plot", action="store_true",
                   help="a bar per cell of its reserved growth and allocator peak, flagged "
                        "re-runs in red (a picture, as the chart's)")


def history(m: Monitor, shell: InteractiveShell, args: argparse.Namespace) -> Any:
    if args.n is not None and args.n <= 0:
        raise UsageError("-n must be a positive number of cells")
    h = m.history
    if args.csv is not None:
        path = os.path.expanduser(args.csv)  # as --trace's and --save's files are
        try:
            h.to_csv(path)
        except OSError as e:
            raise UsageError(f"could not write {quoted(args.csv)}: {safeio.reason(e)}"
                             ) from None
        print(f"wrote {len(h)} cells to {safeio.shown(path)}")
    if args.plot:
        if args.o:
            raise UsageError("history --plot draws a picture; -o returns the table: one or "
                             "the other")
        from ...historyplot import history_plot_bundle

        display(history_plot_bundle(h.records(last=args.n or HISTORY_ROWS), m.verdicts),
                raw=True)
        return None
    if args.o:
        if importlib.util.find_spec("pandas") is None:
            raise UsageError("history -o needs pandas; use --csv FILE without it")
        return h.to_dataframe(last=args.n)
    if args.csv is None:
        display(HistoryTable(h.records(last=args.n or HISTORY_ROWS), total=len(h)))
    return None


HISTORY = Subcommand("history", "the per-cell table", _history_flags, history)


def _summary_flags(s: Parser) -> None:
    s.add_argument("--full", action="store_true", help="append torch.cuda.memory_summary()")
    s.add_argument("--device", type=int, default=0, metavar="N", help="which GPU (default 0)")


def summary(m: Monitor, shell: InteractiveShell, args: argparse.Namespace) -> None:
    st = m.status()
    if st.gpu_count and not 0 <= args.device < st.gpu_count:
        raise UsageError(f"there is no GPU {quoted(str(args.device))}")
    full = m.memory_summary(args.device) if args.full else ""
    sample = with_counted_ooms(m.read(), m.oom_counts())  # cudaMallocAsync counts none
    result = Summary.of(sample, st, device=args.device, full_text=full)
    if m.read_problem:
        result = replace(result, lines=(*result.lines, f"gpumem: {m.read_problem}"))
    display(result)


SUMMARY = Subcommand("summary", "the allocator's fragmentation in plain words, with hints",
                     _summary_flags, summary)


def _oom_flags(o: Parser) -> None:
    o.add_argument("-o", action="store_true", help="return the explanation object")


def oom(m: Monitor, shell: InteractiveShell, args: argparse.Namespace) -> Any:
    last = m.last_oom()
    if last is None:
        # Said under -o too: a bare None in Out would look like a failed call.
        print(m.no_oom_line())
        return None
    if args.o:
        return last
    display(last)
    return None


OOM = Subcommand("oom", "the last CUDA out-of-memory explanation again", _oom_flags, oom)
