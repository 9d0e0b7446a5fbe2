"""``watch``, ``start`` and ``stop``: the live chart and the sampler that feeds it."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.display import display

from ...kernel import Monitor
from ...units import quoted
from ..grammar import Parser, Subcommand, short_message
from .cluster import collector

if TYPE_CHECKING:  # both load when first shown
    from ...chart.compactview import CompactView
    from ...chart.live import MemoryWidget

__all__ = ["START", "STOP", "WATCH", "show_chart", "show_compact"]


def show_chart(monitor: Monitor) -> MemoryWidget:
    """Display the kernel's chart: its live view and its picture (``MemoryWidget.display``).
    Every display of one chart shares their two display_ids, so when the chart ends each of
    them is replaced by its picture."""
    from ...chart.live import show

    widget = show(monitor)
    widget.display(display, monitor.shell)
    return widget


def show_compact(monitor: Monitor) -> CompactView:
    """Display the compact reading (``watch --compact``): one per kernel, shown again where
    it is asked for again."""
    from ...chart.compactview import CompactView

    if monitor.compact is None:
        monitor.compact = CompactView(monitor)
    reading: CompactView = monitor.compact
    reading.display(display, monitor.shell)
    return reading


def _no_flags(p: Parser) -> None:
    pass


def start(m: Monitor, shell: InteractiveShell, args: argparse.Namespace) -> None:
    print(f"gpumem: sampling every {m.start_sampling():g} s")


def stop(m: Monitor, shell: InteractiveShell, args: argparse.Namespace) -> None:
    m.stop_sampling()
    # The cluster's lines come at the sampler's pace: no sampling, no collecting.
    feed = " and the cluster's lines" if m.stop_cluster_feed() else ""
    print(f"gpumem: sampler{feed} stopped; cells are still recorded")


START = Subcommand("start", "start the background sampler", _no_flags, start)
STOP = Subcommand("stop", "stop the background sampler (cells are still recorded)", _no_flags,
                  stop)


def _watch_flags(wa: Parser) -> None:
    wa.add_argument("--replay", metavar="FILE",
                    help="drive the chart from a recorded trace ('bundled' for the H200 one); "
                         "a demonstration only: your cells are still measured live")
    wa.add_argument("--live", action="store_true", help="end a replay: chart this machine")
    wa.add_argument("--stop", action="store_true",
                    help="end the live chart: every output that showed it becomes a static "
                         "picture (for a notebook to save and share)")
    wa.add_argument("--compact", action="store_true",
                    help="one live line per GPU (used, reserved, allocated, headroom, a "
                         "sparkline, the last cell's delta), small enough to keep at the top "
                         "of a notebook; its pin keeps it in sight")
    wa.add_argument("--cluster", nargs="?", const="", metavar="CLIENT",
                    help="add each Dask worker GPU's lines (default: the current client); "
                         "at most one collection a second, until the chart or the sampler "
                         "stops")


def watch(m: Monitor, shell: InteractiveShell, args: argparse.Namespace) -> None:
    if args.stop:
        if args.replay is not None or args.live or args.cluster is not None or args.compact:
            raise UsageError("--stop ends the chart; it goes with none of --replay, "
                             "--live, --cluster and --compact")
        if m.end_chart():
            print("gpumem: chart stopped; each of its outputs is now its picture (a saved "
                  "notebook shows that, with or without a kernel)")
        else:
            print("gpumem: no chart was live; nothing to stop")
        return
    if args.compact:
        if args.replay is not None or args.live or args.cluster is not None:
            raise UsageError("--compact reads this machine; it goes with none of --replay, "
                             "--live and --cluster")
        show_compact(m)
        return
    found = None
    if args.cluster is not None:
        # The cluster's lines are live: they go on this machine's chart, not a replay's.
        if args.replay is not None:
            raise UsageError("--cluster adds live lines; it does not go with --replay")
        if m.replay is not None and not args.live:
            raise UsageError("the chart is replaying a recording: add --live to chart "
                             "this machine with the cluster's lines")
        found = collector(m, shell, args.cluster)  # checked before anything starts
    if args.replay is not None:
        try:
            m.start_replay(args.replay)
        except (ValueError, OSError) as e:
            raise UsageError(short_message(f"cannot replay {quoted(args.replay)}: {e}")
                             ) from None
    elif args.live:
        m.stop_replay()
    if found is not None:
        m.start_cluster_feed(found)
    show_chart(m)


WATCH = Subcommand("watch", "the live chart", _watch_flags, watch)
