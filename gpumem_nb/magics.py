"""The IPython layer: ``%gpumem`` / ``%%gpumem`` and extension loading. The only module that
imports IPython.

The monitor is stored on the shell itself so that ``%reload_ext`` (which reloads only the
package's top module, then calls unload and load) finds and tears down exactly what the
previous load set up.
"""

from __future__ import annotations

import contextlib
import importlib.util
import shlex
from dataclasses import replace
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import MagicArgumentParser
from IPython.display import display

from . import cleanup, trace
from .analysis import build_record
from .monitor import Monitor, error_text
from .oom import SiteAtFailure, with_counted_ooms
from .records import HistoryTable
from .sampler import check_interval
from .settings import PEAK_PRESERVE, PEAK_RESET, config_path, load_config
from .summary import Summary
from .units import parse_size
from .views import CellReport, ConfigView, Snapshot, WhoReport

_SHELL_ATTR = "_gpumem_nb_monitor"
_HISTORY_ATTR = "_gpumem_nb_history"
_CONFIG_ATTR = "_gpumem_nb_config"


# ------------------------------------------------------------------------------------------
# Argument parsing
# ------------------------------------------------------------------------------------------
class _Parser(MagicArgumentParser):
    def error(self, message: str) -> Any:
        if "invalid choice" in message and "argument cmd" in message:
            word = message.split("invalid choice: ")[1].split(" ")[0]
            raise UsageError(f"%gpumem has no subcommand {word}; try %gpumem? for the list")
        raise UsageError(f"{self.prog}: {message}")


def _build_parser() -> _Parser:
    p = _Parser(prog="%gpumem", add_help=False)
    sub = p.add_subparsers(dest="cmd", parser_class=_Parser)
    h = sub.add_parser("history", prog="%gpumem history")
    h.add_argument("-n", type=int, default=20, help="how many recent cells to show")
    h.add_argument("-o", action="store_true", help="return a DataFrame (pandas) instead")
    h.add_argument("--csv", metavar="FILE", help="write the whole history as CSV")
    w = sub.add_parser("who", prog="%gpumem who")
    w.add_argument("-n", type=int, default=20, help="how many holders to list")
    w.add_argument("--gc", action="store_true",
                   help="also search every object the garbage collector tracks")
    w.add_argument("-o", action="store_true", help="return the report object")
    c = sub.add_parser("cleanup", prog="%gpumem cleanup")
    c.add_argument("--dry-run", action="store_true", help="estimate only; change nothing")
    c.add_argument("--out", action="store_true", help="also clear Out, _, __, ___ and _N")
    c.add_argument("--traceback", action="store_true", default=True,
                   help="drop the stored last exception (the default)")
    c.add_argument("--keep-traceback", action="store_true", help="keep the stored exception")
    c.add_argument("--vars", metavar="A,B", default="",
                   help="also delete these variables (only names you list)")
    c.add_argument("-o", action="store_true", help="return the report object")
    g = sub.add_parser("config", prog="%gpumem config")
    g.add_argument("--interval", type=float, metavar="S", help="sampling interval, 0.05-60 s")
    g.add_argument("--device", metavar="N|all", help="which GPU to record")
    g.add_argument("--threshold", metavar="SIZE", help="re-run growth to flag, e.g. 64MB")
    g.add_argument("--peak", choices=(PEAK_PRESERVE, PEAK_RESET),
                   help="preserve: never reset peak counters; reset: reset before each cell")
    g.add_argument("--auto-show", choices=("on", "off"), help="show the widget on load")
    g.add_argument("--save", action="store_true",
                   help="remember these settings for future sessions (a JSON file)")
    s = sub.add_parser("summary", prog="%gpumem summary")
    s.add_argument("--full", action="store_true", help="append torch.cuda.memory_summary()")
    s.add_argument("--device", type=int, default=0, metavar="N")
    sub.add_parser("start", prog="%gpumem start")
    sub.add_parser("stop", prog="%gpumem stop")
    sub.add_parser("status", prog="%gpumem status")
    o = sub.add_parser("oom", prog="%gpumem oom")
    o.add_argument("-o", action="store_true", help="return the explanation object")
    wa = sub.add_parser("watch", prog="%gpumem watch")
    wa.add_argument("--replay", metavar="FILE",
                    help="drive the chart from a recorded trace ('bundled' for the H200 one); "
                         "a demonstration only: your cells are still measured live")
    wa.add_argument("--live", action="store_true", help="end a replay: chart this machine")
    return p


def _build_cell_parser() -> _Parser:
    p = _Parser(prog="%%gpumem", add_help=False)
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


def _split(line: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError as e:
        raise UsageError(f"could not read the arguments: {e}") from None


GPUMEM_HELP = """Watch, explain and clean up GPU memory.

Line magic:
  %gpumem                      status of every GPU: NVML used/total, this process,
                               allocated, reserved, peak, outside PyTorch, other processes
  %gpumem history [-n N] [-o] [--csv FILE]
                               per-cell table; -o returns a pandas DataFrame
  %gpumem who [-n N] [--gc]    who holds memory: variables (and tensors inside modules,
                               optimizers, lists, dicts), Out[n], the last traceback
  %gpumem cleanup [--dry-run] [--out] [--keep-traceback] [--vars a,b]
                               drop the stored exception, gc.collect, empty_cache; --out also
                               clears the output cache; --vars deletes only the names given
  %gpumem config [--interval S] [--device N|all] [--threshold SIZE]
                 [--peak preserve|reset] [--auto-show on|off] [--save]
                               --save remembers them in ~/.config/gpumem_nb/config.json
  %gpumem summary [--full]     the allocator's fragmentation in plain words, with hints
  %gpumem oom [-o]             the last CUDA out-of-memory explanation again; -o returns it
  %gpumem start | stop         the background sampler
  %gpumem watch [--replay FILE|--live]
                               the live chart

Cell magic:
  %%gpumem [-o] [-q] [--device N] [--reset-peak] [--trace [--top N] [--save FILE]]
      runs the cell and reports its time, allocator peak, deltas and NVML peak.
      --trace records the cell's allocations (native allocator): the lines holding the most
      at the cell's peak and still alive at its end, and a timeline; --save writes the
      snapshot for PyTorch's memory_viz (pickle protocol 4). With --trace, -o returns the
      trace report (its .cell is the measurement).

A CUDA out-of-memory error is explained in the cell that hit it: what was asked, what the GPU
had, the cause (impossible, fragmentation, other processes, outside PyTorch, memory your
session holds) and what to do next.

Peaks: by default gpumem_nb never resets PyTorch's peak counters (you may be reading them).
A cell's peak is then exact whenever the cell set a new process-wide peak, and otherwise a
lower bound shown as ≥. `%gpumem config --peak reset` resets the counters before every cell
for always-exact peaks.
"""


@magics_class
class GpumemMagics(Magics):
    def __init__(self, shell: Any, monitor: Monitor) -> None:
        super().__init__(shell)
        self.monitor = monitor
        self.parser = _build_parser()
        self.cell_parser = _build_cell_parser()

    @line_cell_magic
    def gpumem(self, line: str, cell: str | None = None) -> Any:
        self.monitor.flush()  # earlier cells the sampler has not recorded yet
        if cell is not None:
            return self._cell(line, cell)
        args = self.parser.parse_args(_split(line))
        handler = getattr(self, f"_cmd_{args.cmd or 'status'}")
        return handler(args)

    gpumem.__doc__ = GPUMEM_HELP

    # -- subcommands -------------------------------------------------------------------------
    def _cmd_status(self, args: Any) -> None:
        m = self.monitor
        status = m.source.status()
        if m.sampler.errors:  # logged once when they happened; shown here while they last
            count = sum(m.sampler.errors.values())
            note = f"The sampler hit {count} error(s); the last: {m.sampler.last_error}"
            status = replace(status, notes=(*status.notes, note))
        display(Snapshot(status=status, sample=m.read()))

    def _cmd_history(self, args: Any) -> Any:
        if args.n <= 0:
            raise UsageError("-n must be a positive number of cells")
        h = self.monitor.history
        if args.csv:
            try:
                h.to_csv(args.csv)
            except OSError as e:
                raise UsageError(f"could not write {args.csv}: {e.strerror}") from None
            print(f"wrote {len(h)} cells to {args.csv}")
        if args.o:
            if importlib.util.find_spec("pandas") is None:
                raise UsageError("history -o needs pandas; use --csv FILE without it")
            return h.to_dataframe()
        if not args.csv:
            display(HistoryTable(h.records(last=args.n), total=len(h)))
        return None

    def _cmd_who(self, args: Any) -> Any:
        if args.n <= 0:
            raise UsageError("-n must be a positive number of holders")
        holders = self.monitor.scan(include_gc=args.gc)
        report = WhoReport(holders[: args.n], total=len(holders))
        if args.o:
            return report
        display(report)
        return None

    def _cmd_cleanup(self, args: Any) -> Any:
        names = [n.strip() for n in args.vars.split(",") if n.strip()]
        bad = [n for n in names if not n.isidentifier()]
        if bad:
            raise UsageError(f"--vars takes variable names separated by commas, not {bad[0]!r}")
        request = cleanup.CleanupRequest(
            clear_traceback=not args.keep_traceback, clear_output=args.out,
            delete_vars=names, dry_run=args.dry_run, find_holders=True,
        )
        try:
            report = self.monitor.cleanup(request)
        except (ValueError, RuntimeError) as e:
            raise UsageError(str(e)) from None
        if args.o:
            return report
        display(report)
        return None

    def _cmd_config(self, args: Any) -> None:
        m = self.monitor
        # Validate everything first: a bad value changes nothing.
        interval = None
        if args.interval is not None:
            try:
                interval = check_interval(args.interval)
            except ValueError as e:
                raise UsageError(str(e)) from None
        device = self._parse_device(args.device) if args.device is not None else None
        threshold = None
        if args.threshold is not None:
            try:
                threshold = parse_size(args.threshold)
            except ValueError as e:
                raise UsageError(f"--threshold: {e}") from None
        try:
            m.configure(
                interval_s=interval, threshold_bytes=threshold,
                **({"device": device} if args.device is not None else {}),
                peak=args.peak,
                auto_show=None if args.auto_show is None else args.auto_show == "on",
                save=args.save)
        except ValueError as e:
            raise UsageError(str(e)) from None
        except OSError as e:
            raise UsageError(f"could not save the settings: {e.strerror}") from None
        if args.save:
            print(f"gpumem: settings saved to {config_path()}")
        display(ConfigView(m.config, m.sampler.running))

    def _parse_device(self, text: str) -> int | None:
        if text == "all":
            return None
        n = self.monitor.gpu_count()
        try:
            index = int(text)
        except ValueError:
            raise UsageError(f"--device takes a GPU number or 'all', not {text!r}") from None
        if not 0 <= index < n:
            seen = f"GPUs 0-{n - 1}" if n > 1 else ("GPU 0" if n == 1 else "no GPU")
            raise UsageError(f"there is no GPU {index}: this process sees {seen}")
        return index

    def _cmd_summary(self, args: Any) -> None:
        m = self.monitor
        if m.gpu_count() and not 0 <= args.device < m.gpu_count():
            raise UsageError(f"there is no GPU {args.device}")
        full = m.torch.memory_summary(args.device) if args.full else ""
        sample = with_counted_ooms(m.read(), m.oom.counts)  # cudaMallocAsync counts none
        display(Summary.of(sample, m.source.status(), device=args.device, full_text=full))

    def _cmd_oom(self, args: Any) -> Any:
        last = self.monitor.oom.last
        if args.o:
            return last
        if last is None:
            print(self.monitor.oom.no_oom_line())
        else:
            display(last)
        return None

    def _cmd_start(self, args: Any) -> None:
        self.monitor.sampler.start()
        print(f"gpumem: sampling every {self.monitor.sampler.interval_s:g} s")

    def _cmd_stop(self, args: Any) -> None:
        self.monitor.sampler.stop()
        print("gpumem: sampler stopped; cells are still recorded")

    def _cmd_watch(self, args: Any) -> None:
        from .widget import show

        m = self.monitor
        if args.replay:
            try:
                m.start_replay(args.replay)
            except (ValueError, OSError) as e:
                raise UsageError(f"cannot replay {args.replay}: {e}") from None
        elif args.live:
            m.stop_replay()
        widget = show(m)
        widget.display_handle = display(widget, display_id=True)

    # -- cell magic --------------------------------------------------------------------------
    def _cell(self, line: str, cell: str) -> Any:
        args = self.cell_parser.parse_args(_split(line))
        m = self.monitor
        if args.device is not None:
            self._parse_device(str(args.device))
        if (args.top is not None or args.save) and not args.trace:
            raise UsageError("--top and --save go with --trace")
        if args.top is not None and args.top <= 0:
            raise UsageError("--top must be a positive number of sites")
        tracer = trace.CellTracer() if args.trace else None
        why = tracer.start() if tracer is not None else ""
        if why:
            print(f"gpumem --trace: {why}")
            tracer = None
        reset = args.reset_peak or m.config.peak == PEAK_RESET
        before, wm, did_reset = m.begin(reset_peak=reset)
        shell: Any = self.shell
        result = shell.run_cell(cell, store_history=False)
        after = m.end(wm)
        traced = tracer.stop(top=args.top or trace.TOP_DEFAULT, save=args.save) \
            if tracer is not None else None
        try:  # the monitor's own hook sees only top-level cells; this one ran nested
            m.oom.on_cell_result(result, sites=[SiteAtFailure(label, n) for label, n in (
                traced.sites_at_failure() if traced is not None else ())])
        except Exception as e:
            m._contain("OOM explainer", e)
        rec = build_record(
            execution_count=getattr(self.shell, "execution_count", None), cell_key="%%gpumem",
            source=cell, before=before, after=after, watermark=wm, reset_at_start=did_reset,
            error=error_text(result),
        )
        if args.device is not None:
            rec = replace(rec, devices=tuple(d for d in rec.devices if d.index == args.device))
        report = CellReport(rec)
        if not args.q:
            print(report.line())
        if traced is not None:
            shown = trace.views(traced, report)
            if not args.q:
                display(*shown)
            return shown[0] if args.o else None
        return report if args.o else None


# ------------------------------------------------------------------------------------------
# Extension entry points
# ------------------------------------------------------------------------------------------
def current_monitor(shell: Any = None) -> Monitor | None:
    if shell is None:
        from IPython import get_ipython

        shell = get_ipython()
    return getattr(shell, _SHELL_ATTR, None) if shell is not None else None


def load(shell: Any) -> None:
    if current_monitor(shell) is not None:
        return  # already loaded: one monitor, one thread, one set of callbacks
    # History and settings survive %reload_ext; a first load reads the settings file.
    history = getattr(shell, _HISTORY_ATTR, None)
    config = getattr(shell, _CONFIG_ATTR, None) or load_config()
    monitor = Monitor(shell, history=history, config=config)
    monitor.oom.show = display  # rich output in notebooks, text in terminals
    line = monitor.start()
    shell.events.register("pre_run_cell", monitor.pre_run_cell)
    shell.events.register("post_run_cell", monitor.post_run_cell)
    shell.register_magics(GpumemMagics(shell, monitor))
    setattr(shell, _SHELL_ATTR, monitor)
    setattr(shell, _HISTORY_ATTR, monitor.history)
    setattr(shell, _CONFIG_ATTR, monitor.config)
    print(line)
    if monitor.config.auto_show:
        try:
            from .widget import show

            display(show(monitor))
        except Exception as e:
            monitor._contain("auto-show", e)


def unload(shell: Any) -> None:
    monitor = current_monitor(shell)
    if monitor is None:
        return
    for event, fn in (("pre_run_cell", monitor.pre_run_cell),
                      ("post_run_cell", monitor.post_run_cell)):
        with contextlib.suppress(ValueError):
            shell.events.unregister(event, fn)
    monitor.shutdown()
    magics = shell.magics_manager.magics
    magics["line"].pop("gpumem", None)
    magics["cell"].pop("gpumem", None)
    delattr(shell, _SHELL_ATTR)
