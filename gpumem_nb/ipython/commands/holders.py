"""``who`` and ``cleanup``: who holds the GPU's memory, and letting go of it."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.display import display

from ... import cleanup as cleaning
from ...kernel import Monitor
from ...ledger import ledgers_of
from ...oom.rawpart import ledgers_with_raw_blocks
from ...units import quoted
from ...views import WhoReport
from ..grammar import Parser, Subcommand, short_message

__all__ = ["CLEANUP", "WHO"]


def _who_flags(w: Parser) -> None:
    w.add_argument("-n", type=int, default=20, help="how many holders to list")
    w.add_argument("--gc", action="store_true",
                   help="also search every object the garbage collector tracks")
    w.add_argument("-o", action="store_true", help="return the report object")


def who(m: Monitor, shell: InteractiveShell, args: argparse.Namespace) -> Any:
    if args.n <= 0:
        raise UsageError("-n must be a positive number of holders")
    holders = m.scan(include_gc=args.gc)
    try:
        segments = cleaning.allocator_segments()
        ledgers = ledgers_of(m.read_hot(), holders, segments, m.ledger_pools)
        if args.gc:
            # What the whole search left "not found": the blocks no tensor lies over, and
            # the ints that point at them (the OOM explanation's part).
            ledgers = ledgers_with_raw_blocks(ledgers, segments, holders,
                                              getattr(shell, "user_ns", None), sys.modules)
    except Exception:  # a reading that fails leaves the table as it is
        ledgers = ()
    report = WhoReport(holders[: args.n], total=len(holders), ledgers=ledgers)
    if args.o:
        return report
    display(report)
    return None


WHO = Subcommand("who", "who holds memory: variables (and tensors inside modules, optimizers,\n"
                        "lists, dicts), Out[n], the last traceback", _who_flags, who)


def _cleanup_flags(c: Parser) -> None:
    c.add_argument("--dry-run", action="store_true", help="estimate only; change nothing")
    c.add_argument("--out", action="store_true", help="also clear Out, _, __, ___ and _N")
    c.add_argument("--keep-traceback", action="store_true",
                   help="keep the stored last exception (dropped by default)")
    c.add_argument("--vars", metavar="A,B", default="",
                   help="also delete these variables (only names you list)")
    c.add_argument("-o", action="store_true", help="return the report object")


def cleanup(m: Monitor, shell: InteractiveShell, args: argparse.Namespace) -> Any:
    names = [n.strip() for n in args.vars.split(",") if n.strip()]
    bad = [n for n in names if not n.isidentifier()]
    if bad:
        raise UsageError("--vars takes variable names separated by commas, not "
                         f"{quoted(bad[0])}")
    request = cleaning.CleanupRequest(
        clear_traceback=not args.keep_traceback, clear_output=args.out,
        delete_vars=names, dry_run=args.dry_run, find_holders=True,
        pools=m.ledger_pools,
    )
    try:
        # A Ctrl-C is re-raised after the report of what was done until then is shown.
        report = m.cleanup(request, on_interrupt=lambda r: _show_through_ctrl_c(shell, r))
    except (ValueError, RuntimeError) as e:
        raise UsageError(short_message(str(e))) from None
    if args.o:
        return report
    _show_through_ctrl_c(shell, report)
    return None


def _show_through_ctrl_c(shell: InteractiveShell, report: Any) -> None:
    """Show the report; a Ctrl-C during the showing (after the steps ran: variables may be
    gone already) still leaves what was done on the page, as plain text, then goes on."""
    try:
        display(report)
    except KeyboardInterrupt:
        shell.display_pub.publish(data={"text/plain": str(report)})
        raise


CLEANUP = Subcommand(
    "cleanup", "gc.collect, drop the stored exception, empty_cache (each row: what its own\n"
               "step freed); --out also clears the output cache; --vars deletes only the "
               "names given", _cleanup_flags, cleanup)
