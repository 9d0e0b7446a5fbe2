"""``%%gpumem``: a cell measured between two exact readings, and traced on request. The
measuring is the engine's (``CellRecorder.measure``); this is its grammar and its report."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.display import display

from ... import safeio, trace
from ...errtext import one_read_per_error
from ...kernel import Monitor
from ...kernel.measure import TraceAsk
from ...settings import SettingsError
from ...units import quoted
from ...views import CellReport
from ..grammar import Parser, device_arg, parse

__all__ = ["build_cell_parser", "measured_cell"]

_TEXT = """\
runs the cell and reports its time, allocator peak, deltas and NVML peak.
--trace records the cell's allocations (native allocator): the lines holding the most
at the cell's peak and still alive at its end, and a timeline; --save writes the
snapshot for PyTorch's memory_viz (pickle protocol 4). With --trace, -o returns the
trace report (its .cell is the measurement)."""


def build_cell_parser() -> Parser:
    p = Parser(prog="%%gpumem", add_help=False, description=_TEXT)
    p.add_argument("-o", action="store_true", help="return the measurement")
    p.add_argument("-q", action="store_true", help="quiet: print no report")
    p.add_argument("--device", type=int, metavar="N", help="report only this GPU")
    p.add_argument("--reset-peak", action="store_true",
                   help="reset the allocator's peak counters first (exact peak, always)")
    p.add_argument("--trace", action="store_true",
                   help="record this cell's allocations: top sites and a timeline")
    p.add_argument("--top", type=int, metavar="N", help="sites to list with --trace (5)")
    p.add_argument("--save", metavar="FILE",
                   help="with --trace: write the snapshot for PyTorch's memory_viz")
    return p


def measured_cell(m: Monitor, shell: InteractiveShell, parser: Parser, argv: list[str],
                  cell: str) -> Any:
    # The body's exception is read by its own nested hook, the OOM explainer and the
    # record: its text once for all of them (errtext).
    with one_read_per_error():
        return _measured_cell(m, shell, parser, argv, cell)


def _measured_cell(m: Monitor, shell: InteractiveShell, parser: Parser, argv: list[str],
                   cell: str) -> Any:
    args = parse(parser, argv)
    if args.device is not None:
        try:
            m.check_device(device_arg(str(args.device)))
        except SettingsError as e:
            # A notebook written on a GPU machine, run on a laptop: the cell is the
            # user's work and runs all the same; only this GPU's report is missing.
            print(f"gpumem: --device {args.device}: {e.why}; the cell runs all the "
                  "same, measured without that GPU.")
    if (args.top is not None or args.save is not None) and not args.trace:
        raise UsageError("--top and --save go with --trace")
    if args.top is not None and args.top <= 0:
        raise UsageError("--top must be a positive number of sites")
    save = _save_target(args.save) if args.save is not None else None

    def run() -> Any:
        return shell.run_cell(cell, store_history=False)

    ask = TraceAsk(args.top or trace.TOP_DEFAULT, save, m.traces.cell_texts.reader) \
        if args.trace else None
    measured = m.measure(cell, run, reset_peak=args.reset_peak, trace=ask, quiet=args.q)
    rec = measured.record
    if rec is None:
        return None
    if args.device is not None:
        rec = replace(rec, devices=tuple(d for d in rec.devices if d.index == args.device))
    report = CellReport(rec)
    if not args.q:
        print(report.line())
    if measured.traced is not None:
        shown = trace.views(measured.traced, report)
        if not args.q:
            display(*shown)
        return shown[0] if args.o else None
    return report if args.o else None


def _save_target(path: str) -> str:
    """``--save``'s file, checked before the cell runs: a regular file (or none yet) in a
    directory that exists, never a link, a FIFO or a device."""
    if not path.strip():
        raise UsageError("--save needs a file name, for example --save cell.pickle")
    try:
        safeio.check_writable(os.path.expanduser(path))
    except OSError as e:
        raise UsageError(f"--save: cannot write {quoted(path)}: {safeio.reason(e)}") from None
    return path
