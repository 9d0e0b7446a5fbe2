"""The IPython layer: ``%gpumem`` / ``%%gpumem`` and extension loading. The only module that
imports IPython.

The monitor is stored on the shell itself so that ``%reload_ext`` (which reloads only the
package's top module, then calls unload and load) finds and tears down exactly what the
previous load set up.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import difflib
import importlib.util
import os
import re
import shlex
import sys
import weakref
from dataclasses import replace
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import MagicArgumentParser
from IPython.display import display

from . import cleanup, safeio, trace
from .analysis import build_record
from .configurable import GpumemNb
from .errtext import one_read_per_error
from .ledger import ledgers_of
from .monitor import UNCHANGED, Monitor, error_text
from .oom import SiteAtFailure, with_counted_ooms
from .records import HistoryTable
from .settings import (
    PEAK_PRESERVE,
    PEAK_RESET,
    DeviceChoice,
    SettingsError,
    config_path,
    load_settings,
)
from .summary import Summary
from .units import ECHO_CHARS, echo_cut, format_bytes, parse_size, printable, quoted
from .views import CellReport, ConfigView, Snapshot, WhoReport

_SHELL_ATTR = "_gpumem_nb_monitor"
_HISTORY_ATTR = "_gpumem_nb_history"
_CONFIG_ATTR = "_gpumem_nb_config"
_RECORDED_ATTR = "_gpumem_nb_recorded_session"  # a session kept across %reload_ext
_SESSION_KEYS_ATTR = "_gpumem_nb_session_keys"  # settings changed since the kernel started
MIN_GPU_BYTES = 256 << 20  # less is no GPU PyTorch runs on: a size without its unit
_MAGICS_ATTR = "_gpumem_nb_magics"
_TRAITS_ATTR = "_gpumem_nb_traits"  # the GpumemNb configurable (%config GpumemNb)


# ------------------------------------------------------------------------------------------
# Argument parsing
# ------------------------------------------------------------------------------------------
# Every input to %gpumem / %%gpumem ends in a result or a UsageError with a plain sentence:
# argparse's own errors come through _Parser.error, values are checked by the same functions
# that guard the settings file (Monitor.configure), and tests/test_fuzz_magics.py holds this.
class _Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str) -> None:
        # A fixed width: %gpumem? reads the same in every terminal and notebook.
        super().__init__(prog, width=92, max_help_position=28)


class _Parser(MagicArgumentParser):
    def __init__(self, **kw: Any) -> None:
        kw.setdefault("formatter_class", _Formatter)
        super().__init__(**kw)

    def error(self, message: str) -> Any:
        # argparse quotes the user's words as typed; a lone surrogate in them would make
        # printing the message raise in turn.
        message = message.encode("utf-8", "backslashreplace").decode("utf-8")
        found = re.match(r"argument SUBCOMMAND: invalid choice: (.*) \(choose from", message,
                         re.S)
        if found:
            typed = found.group(1)
            hint = _did_you_mean(typed.strip("'\""), _subparsers(self))
            raise UsageError(f"%gpumem has no subcommand {echo_cut(typed)}; "
                             f"{hint or 'try %gpumem? for the list'}")
        # Most of argparse's messages quote the user's word (repr); "ambiguous option: --x
        # could match" echoes it as typed.
        raise UsageError(short_message(f"{self.prog}: {printable(message)}"))


def _did_you_mean(typed: str, known: Any) -> str:
    """"did you mean 'history'?" for the closest of ``known`` words, as git does; "" when
    none is close (a typo, not another word)."""
    close = difflib.get_close_matches(typed, list(known), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else ""


def _unknown_flags_error(prog: str, parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """argparse's "unrecognized arguments" sentence, with the closest flag of ``parser``
    suggested for the first unknown one shown that looks like a flag; at most
    ``MAX_MESSAGE_CHARS`` with the suggestion. The words are made printable: an escape typed
    in a flag (``--\x1b[31mred``) must not reach the terminal live."""
    head = f"{prog}: unrecognized arguments: "
    shown: list[str] = []
    size = len(head)
    for word in extras:  # only the words the message can show: 5,000 extras cost no more
        if size > MAX_MESSAGE_CHARS:
            break
        shown.append(printable(word))
        size += len(shown[-1]) + 1
    flags = [f for a in parser._actions for f in a.option_strings]
    hint = next((h for w in shown if w.startswith("--")
                 and (h := _did_you_mean(w.split("=", 1)[0], flags))), "")
    tail = f"; {hint}" if hint else ""
    return short_message(head + " ".join(shown), MAX_MESSAGE_CHARS - len(tail)) + tail


def _build_parser() -> _Parser:
    p = _Parser(prog="%gpumem", add_help=False)
    sub = p.add_subparsers(dest="cmd", parser_class=_Parser, metavar="SUBCOMMAND")

    def add(name: str, text: str) -> _Parser:
        return sub.add_parser(name, prog=f"%gpumem {name}", help=text, description=text)

    add("status", "status of every GPU (the same as a bare %gpumem): NVML used/total, this "
                  "process,\nallocated, reserved, peak, outside PyTorch, other processes")
    h = add("history", "the per-cell table")
    h.add_argument("-n", type=int, help="how many recent cells to show (20; with -o: all)")
    h.add_argument("-o", action="store_true",
                   help="return a DataFrame (pandas) instead, of the last -n cells if given")
    h.add_argument("--csv", metavar="FILE", help="write the whole history as CSV")
    w = add("who", "who holds memory: variables (and tensors inside modules, optimizers,\n"
                   "lists, dicts), Out[n], the last traceback")
    w.add_argument("-n", type=int, default=20, help="how many holders to list")
    w.add_argument("--gc", action="store_true",
                   help="also search every object the garbage collector tracks")
    w.add_argument("-o", action="store_true", help="return the report object")
    c = add("cleanup", "gc.collect, drop the stored exception, empty_cache (each row: what its "
                       "own\nstep freed); --out also clears the output cache; --vars deletes "
                       "only the names given")
    c.add_argument("--dry-run", action="store_true", help="estimate only; change nothing")
    c.add_argument("--out", action="store_true", help="also clear Out, _, __, ___ and _N")
    c.add_argument("--keep-traceback", action="store_true",
                   help="keep the stored last exception (dropped by default)")
    c.add_argument("--vars", metavar="A,B", default="",
                   help="also delete these variables (only names you list)")
    c.add_argument("-o", action="store_true", help="return the report object")
    g = add("config", "show or change the settings; --save remembers them in\n"
                      "~/.config/gpumem_nb/config.json (or the file $GPUMEM_NB_CONFIG names)")
    g.add_argument("--interval", type=float, metavar="S", help="sampling interval, 0.05-60 s")
    g.add_argument("--device", metavar="N|all", help="which GPU to record")
    g.add_argument("--threshold", metavar="SIZE", help="re-run growth to flag, e.g. 64MB")
    g.add_argument("--peak", choices=(PEAK_PRESERVE, PEAK_RESET),
                   help="preserve: never reset peak counters; reset: reset before each cell")
    g.add_argument("--auto-show", choices=("on", "off"), help="show the widget on load")
    g.add_argument("--save", action="store_true",
                   help="remember these settings for future sessions (a JSON file)")
    s = add("summary", "the allocator's fragmentation in plain words, with hints")
    s.add_argument("--full", action="store_true", help="append torch.cuda.memory_summary()")
    s.add_argument("--device", type=int, default=0, metavar="N", help="which GPU (default 0)")
    o = add("oom", "the last CUDA out-of-memory explanation again")
    o.add_argument("-o", action="store_true", help="return the explanation object")
    add("start", "start the background sampler")
    add("stop", "stop the background sampler (cells are still recorded)")
    wa = add("watch", "the live chart")
    wa.add_argument("--replay", metavar="FILE",
                    help="drive the chart from a recorded trace ('bundled' for the H200 one); "
                         "a demonstration only: your cells are still measured live")
    wa.add_argument("--live", action="store_true", help="end a replay: chart this machine")
    wa.add_argument("--stop", action="store_true",
                    help="end the live chart: every output that showed it becomes a static "
                         "picture (for a notebook to save and share)")
    wa.add_argument("--cluster", nargs="?", const="", metavar="CLIENT",
                    help="add each Dask worker GPU's lines (default: the current client); "
                         "at most one collection a second, until the chart or the sampler "
                         "stops")
    cl = add("cluster", "a Dask cluster's GPUs: one row per worker and GPU (NVML used/total, "
                        "that\nworker's own share, its allocator), each GPU counted once")
    cl.add_argument("client", nargs="?", metavar="CLIENT",
                    help="the variable holding your distributed.Client (default: the current)")
    cl.add_argument("--timeout", type=float, default=2.0, metavar="S",
                    help="how long to wait for the scheduler (2 s, at most 60); then rows "
                         "read unknown")
    cl.add_argument("-o", action="store_true", help="return the reading")
    wi = add("whatif", "replay a traced cell's allocations under other allocator settings:\n"
                       "peak and end reserved, stranded bytes, cudaMalloc/cudaFree calls, OOM")
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
    rec = add("record", "record the allocator's history for the whole session (for "
                        "%gpumem whatif --session)")
    rec.add_argument("state", nargs="?", choices=("on", "off", "status"), default="status")
    rec.add_argument("--start-cuda", action="store_true",
                     help="with CUDA not started yet: start it now and record from an empty GPU")
    rec.add_argument("--max-entries", type=int, metavar="N",
                     help="allocator events kept at most (100000, at most 1000000; older "
                          "ones are dropped)")
    return p


# No command takes more than a few dozen words, and argparse's own loop costs the square of
# the flags it is given (5,000 unknown flags: 0.35 s of a 0.46 s refusal): it reads at most
# this many, and a longer line is refused for what those words already hold.
MAX_PARSED_WORDS = 200


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> Any:
    """``parser.parse_args``, but an unknown flag gets the closest known one suggested (the
    subcommand's own flags: argparse reports extras from the top parser, which knows none)."""
    read = MAX_PARSED_WORDS
    if len(argv) > read and argv[read - 1].startswith("-"):
        read += 1  # the last flag read keeps the value that follows it
    args, extras = parser.parse_known_args(argv[:read])
    chosen = _subparsers(parser).get(getattr(args, "cmd", None) or "", parser)
    if extras:
        raise UsageError(_unknown_flags_error(chosen.prog, chosen, extras))
    if len(argv) > read:
        raise UsageError(f"{chosen.prog}: {len(argv):,} words is more than any command "
                         f"takes (at most {MAX_PARSED_WORDS})")
    return args


def _build_cell_parser() -> _Parser:
    text = """\
runs the cell and reports its time, allocator peak, deltas and NVML peak.
--trace records the cell's allocations (native allocator): the lines holding the most
at the cell's peak and still alive at its end, and a timeline; --save writes the
snapshot for PyTorch's memory_viz (pickle protocol 4). With --trace, -o returns the
trace report (its .cell is the measurement)."""
    p = _Parser(prog="%%gpumem", add_help=False, description=text)
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


def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _usage(p: argparse.ArgumentParser, width: int = 90) -> str:
    """The usage line, wrapped between bracketed options, never inside one."""
    words = re.findall(r"\[[^\]]*\]|\S+", p.format_usage().removeprefix("usage: "))
    lines, line = [], "  " + words[0]
    for word in words[1:]:
        if len(line) + 1 + len(word) > width:
            lines.append(line)
            line = " " * (len(p.prog) + 3) + word
        else:
            line += " " + word
    return "\n".join([*lines, line])


def _section(p: argparse.ArgumentParser) -> str:
    """One subcommand's usage line, what it does, and its options, indented."""
    lines = [_usage(p)]
    lines += [f"      {ln}" for ln in (p.description or "").splitlines()]
    opts = p.format_help().split("options:\n", 1)
    if len(opts) == 2:
        lines += [f"    {ln}" for ln in opts[1].rstrip().splitlines()]
    return "\n".join(lines)


_OOM_NOTE = """\
A CUDA out-of-memory error is explained in the cell that hit it: what was asked, what the GPU
had, the cause (impossible, fragmentation, other processes, outside PyTorch, memory your
session holds) and what to do next."""

_PEAKS_NOTE = """\
Peaks: by default gpumem_nb never resets PyTorch's peak counters (you may be reading them).
A cell's peak is then exact whenever the cell set a new process-wide peak, and otherwise a
lower bound shown as ≥. `%gpumem config --peak reset` resets the counters before every cell
for always-exact peaks."""


def help_text(subcommand: str | None = None) -> str:
    """``%gpumem?``, written from the parsers themselves so it cannot drift from them."""
    subs = _subparsers(_build_parser())
    if subcommand in subs:
        return _section(subs[subcommand])
    parts = ["Watch, explain and clean up GPU memory.", "",
             "Line magic: %gpumem [SUBCOMMAND] [options]   (-h after a subcommand: its help)"]
    parts += [_section(sp) + "\n" for sp in subs.values()]
    parts += ["Cell magic:", _section(_build_cell_parser()), "", _OOM_NOTE, "", _PEAKS_NOTE, ""]
    return "\n".join(parts)


def _split(line: str) -> list[str]:
    try:
        return _glue_negative_values(shlex.split(line))
    except ValueError as e:
        raise UsageError(f"could not read the arguments: {e}") from None


# What argparse itself reads as a negative number; any other word starting with "-" it takes
# for an option, so "--timeout -inf" failed with "expected one argument".
_ARGPARSE_NEGATIVE = re.compile(r"^-\d+$|^-\d*\.\d+$")
_NEGATIVE_SIZE = re.compile(r"^-[0-9.]")  # -1GiB: no option starts with a digit


def _glue_negative_values(argv: list[str]) -> list[str]:
    """``--opt -inf`` (or ``-1e3``, ``-nan``, ``-1GiB``) as ``--opt=-inf``: the value then
    reaches the option's own check, which says what it takes."""
    out: list[str] = []
    for word in argv:
        if out and out[-1].startswith("-") and "=" not in out[-1] and word.startswith("-") \
                and not _ARGPARSE_NEGATIVE.match(word) and (
                    _is_float(word) or _NEGATIVE_SIZE.match(word)):
            out[-1] = f"{out[-1]}={word}"
        else:
            out.append(word)
    return out


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# The magic's flag for each setting, so a refused value is reported in the user's words.
_FLAGS = {"interval_s": "--interval", "threshold_bytes": "--threshold", "device": "--device",
          "peak": "--peak", "auto_show": "--auto-show"}


def _device_arg(text: str) -> int | None:
    """``--device``'s text: 'all' (None) or a GPU number; the range is the monitor's."""
    if text == "all":
        return None
    try:
        index = int(text)
    except ValueError:  # also a number too long to read (over 4300 digits)
        index = -1
    if index < 0:
        raise UsageError(f"--device takes a GPU number or 'all', not {quoted(text)}")
    return index


# %gpumem history shows this many recent cells unless -n says otherwise.
HISTORY_ROWS = 20

# %gpumem cluster --timeout: below this no scheduler answers (a broadcast reaches every worker).
MIN_TIMEOUT_S = 0.1
MAX_TIMEOUT_S = 60.0

MAX_MESSAGE_CHARS = 400


def short_message(message: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """A message holding the user's words (argparse quotes them whole): every word longer
    than ``ECHO_CHARS`` cut, and the whole at most ``limit`` characters, its "…" included."""
    if len(message) <= min(ECHO_CHARS, limit):
        return message
    words = re.sub(rf"\S{{{ECHO_CHARS + 1},}}", lambda m: echo_cut(m.group(0)), message)
    return words if len(words) <= limit else words[: limit - 1] + "…"


@magics_class
class GpumemMagics(Magics):
    def __init__(self, shell: Any, monitor: Monitor) -> None:
        super().__init__(shell)
        self.monitor = monitor
        self.parser = _build_parser()
        self.cell_parser = _build_cell_parser()

    @line_cell_magic
    def gpumem(self, line: str, cell: str | None = None) -> Any:
        try:
            return self._gpumem(line, cell)
        except UsageError as e:
            text = str(e)
            if len(text) <= MAX_MESSAGE_CHARS:
                raise
            raise UsageError(short_message(text)) from None

    def _gpumem(self, line: str, cell: str | None) -> Any:
        argv = _split(line)
        if "-h" in argv or "--help" in argv:  # help is an answer, never a UsageError
            print(help_text(None if cell is not None or not argv else argv[0]))
            return None
        if cell is not None:
            return self._cell(argv, cell)
        args = _parse(self.parser, argv)
        self.monitor.flush()  # earlier cells the sampler has not recorded yet
        handler = getattr(self, f"_cmd_{args.cmd or 'status'}")
        return handler(args)

    gpumem.__doc__ = help_text()

    # -- subcommands -------------------------------------------------------------------------
    def _cmd_status(self, args: Any) -> None:
        m = self.monitor
        status = m.status()
        m.learn_child_roles()
        sample = m.read()
        notes = [f"gpumem: {m.read_problem}"] if m.read_problem else []
        if m.sampler.errors:  # logged once when they happened; shown here while they last
            count = sum(m.sampler.errors.values())
            notes.append(f"The sampler hit {count} error(s); the last: "
                         f"{m.sampler.last_error[:300]}")
        if m.cuda_start.line():
            notes.append(m.cuda_start.line())
        status = replace(status, notes=(*status.notes, *notes))
        display(Snapshot(status=status, sample=sample))

    def _cmd_history(self, args: Any) -> Any:
        if args.n is not None and args.n <= 0:
            raise UsageError("-n must be a positive number of cells")
        h = self.monitor.history
        if args.csv is not None:
            path = os.path.expanduser(args.csv)  # as --trace's and --save's files are
            try:
                h.to_csv(path)
            except OSError as e:
                raise UsageError(f"could not write {quoted(args.csv)}: {safeio.reason(e)}"
                                 ) from None
            print(f"wrote {len(h)} cells to {safeio.shown(path)}")
        if args.o:
            if importlib.util.find_spec("pandas") is None:
                raise UsageError("history -o needs pandas; use --csv FILE without it")
            return h.to_dataframe(last=args.n)
        if args.csv is None:
            display(HistoryTable(h.records(last=args.n or HISTORY_ROWS), total=len(h)))
        return None

    def _cmd_who(self, args: Any) -> Any:
        if args.n <= 0:
            raise UsageError("-n must be a positive number of holders")
        holders = self.monitor.scan(include_gc=args.gc)
        try:
            ledgers = ledgers_of(self.monitor.read_hot(), holders, cleanup.allocator_segments(),
                                 self.monitor.oom.ledger_pools)
        except Exception:  # a reading that fails leaves the table as it is
            ledgers = ()
        report = WhoReport(holders[: args.n], total=len(holders), ledgers=ledgers)
        if args.o:
            return report
        display(report)
        return None

    def _cmd_cleanup(self, args: Any) -> Any:
        names = [n.strip() for n in args.vars.split(",") if n.strip()]
        bad = [n for n in names if not n.isidentifier()]
        if bad:
            raise UsageError("--vars takes variable names separated by commas, not "
                             f"{quoted(bad[0])}")
        request = cleanup.CleanupRequest(
            clear_traceback=not args.keep_traceback, clear_output=args.out,
            delete_vars=names, dry_run=args.dry_run, find_holders=True,
            pools=self.monitor.oom.ledger_pools,
        )
        try:
            # A Ctrl-C is re-raised after the report of what was done until then is shown.
            report = self.monitor.cleanup(request, on_interrupt=display)
        except (ValueError, RuntimeError) as e:
            raise UsageError(short_message(str(e))) from None
        if args.o:
            return report
        display(report)
        return None

    def _cmd_config(self, args: Any) -> None:
        m = self.monitor
        # Only the monitor writes settings: it checks every value, saves, then applies, so a
        # refused value or a failed save changes nothing.
        threshold = None
        if args.threshold is not None:
            try:
                threshold = parse_size(args.threshold)
            except ValueError as e:
                raise UsageError(short_message(f"--threshold: {e}")) from None
        try:
            m.configure(
                interval_s=args.interval, threshold_bytes=threshold,
                device=UNCHANGED if args.device is None else _device_arg(args.device),
                peak=args.peak,
                auto_show=None if args.auto_show is None else args.auto_show == "on",
                save=args.save,
            )
        except SettingsError as e:
            raise UsageError(f"{_FLAGS.get(e.key, e.key)}: {e.why}") from None
        except OSError as e:
            raise UsageError(f"could not save the settings to {safeio.shown(config_path())}: "
                             f"{safeio.reason(e)}; nothing was changed") from None
        typed = (args.threshold or "").strip()
        if threshold is not None and format_bytes(threshold).replace(" ", "") != typed:
            # 512MB is decimal: say what it came to, beside what was typed.
            print(f"gpumem: threshold {typed} = {format_bytes(threshold)} "
                  f"({threshold:,} bytes)")
        if args.save:
            what = ", ".join(m.saved_keys) if m.saved_keys else \
                "nothing (no setting was changed in this session; device is never saved)"
            print(f"gpumem: saved {what} to {safeio.shown(config_path())}")
            if m.save_note:
                print(f"gpumem: {m.save_note}.")
        display(ConfigView(m.config, m.sampler.running))

    def _cmd_summary(self, args: Any) -> None:
        m = self.monitor
        status = m.status()
        if status.gpu_count and not 0 <= args.device < status.gpu_count:
            raise UsageError(f"there is no GPU {quoted(str(args.device))}")
        full = m.torch.memory_summary(args.device) if args.full else ""
        sample = with_counted_ooms(m.read(), m.oom.counts)  # cudaMallocAsync counts none
        summary = Summary.of(sample, status, device=args.device, full_text=full)
        if m.read_problem:
            summary = replace(summary, lines=(*summary.lines, f"gpumem: {m.read_problem}"))
        display(summary)

    def _cmd_oom(self, args: Any) -> Any:
        last = self.monitor.oom.last
        if last is None:
            # Said under -o too: a bare None in Out would look like a failed call.
            print(self.monitor.oom.no_oom_line())
            return None
        if args.o:
            return last
        display(last)
        return None

    def _session(self) -> Any:
        from .session import SessionRecorder

        # Kept on the monitor, as last_trace is; unloading the extension ends it.
        m = self.monitor
        rec = getattr(m, "session", None)
        if rec is None:
            rec = SessionRecorder()
            setattr(m, "session", rec)  # noqa: B010 - monitor.py is issue 26's file
        return rec

    def _cmd_record(self, args: Any) -> None:
        rec = self._session()
        from .whatif.snapshot import MAX_HISTORY_ENTRIES

        # No more than --session replays: past it, reading the history back alone takes
        # minutes (176 ms per 100,000 entries on the H200) and gigabytes of dicts.
        if args.max_entries is not None and not 1 <= args.max_entries <= MAX_HISTORY_ENTRIES:
            raise UsageError(f"--max-entries is a number of events between 1 and "
                             f"{MAX_HISTORY_ENTRIES} (what %gpumem whatif --session replays "
                             f"at most), not {args.max_entries}")
        if args.max_entries is not None and args.state == "on" and rec.active and \
                args.max_entries != rec.max_entries:
            raise UsageError(f"the session recording is already on, keeping "
                             f"{rec.max_entries} events: switch it off first "
                             f"(%gpumem record off) to record with --max-entries "
                             f"{args.max_entries}")
        if args.state == "on":
            print(rec.start(start_cuda=args.start_cuda, max_entries=args.max_entries))
        elif args.state == "off":
            print(rec.stop())
        else:
            print(rec.status())
        self.monitor.oom.extra_lines = self._default_oom_lines()

    def _default_oom_lines(self) -> Any:
        """The OOM explainer's what-if line between traced cells: the session's, while one
        is recorded."""
        rec = getattr(self.monitor, "session", None)
        return _session_whatif_lines(rec) if rec is not None and rec.on else None

    def _cmd_whatif(self, args: Any) -> Any:
        from .whatif import api as wi

        extra_notes: tuple[str, ...] = ()
        if args.session:
            if args.trace != "last":
                raise UsageError("--session replays the session recording: leave --trace out")
            got = self._session().snapshot()
            if got is None:
                raise UsageError("no session recording: switch it on with %gpumem record on, "
                                 "run the cells, then %gpumem whatif --session")
            source: Any = got.snapshot
            extra_notes = got.notes
        elif args.trace == "last":
            last = self.monitor.last_trace
            source = getattr(last, "snapshot", None)
            if source is None:
                raise UsageError("no traced cell to replay yet: run a cell under %%gpumem "
                                 "--trace first, or name a snapshot file with --trace FILE")
        else:
            source = os.path.expanduser(args.trace)  # as --save's file is
        capacity = None
        if args.capacity is not None:
            try:
                capacity = 0 if args.capacity.strip().startswith("-") else \
                    parse_size(args.capacity)
            except ValueError as e:
                raise UsageError(short_message(f"--capacity: {e}")) from None
            if not 0 < capacity <= wi.MAX_CAPACITY_BYTES:
                raise UsageError(f"--capacity must be a size above zero and at most "
                                 f"{format_bytes(wi.MAX_CAPACITY_BYTES)}, not "
                                 f"{quoted(args.capacity)}")
        total = None
        if args.gpu is not None:
            try:
                total = 0 if args.gpu.strip().startswith("-") else parse_size(args.gpu)
            except ValueError as e:
                raise UsageError(short_message(f"--gpu: {e}")) from None
            if not 0 < total <= wi.MAX_CAPACITY_BYTES:
                raise UsageError(f"--gpu must be a size above zero and at most "
                                 f"{format_bytes(wi.MAX_CAPACITY_BYTES)}, not "
                                 f"{quoted(args.gpu)}")
            if total < MIN_GPU_BYTES:
                # "--gpu 80", written as --fit 80 is, is 80 bytes: every row would run out.
                raise UsageError(f"--gpu is the GPU's memory with its unit, such as 80GiB; "
                                 f"{quoted(args.gpu)} is {format_bytes(total)}")
        fit_gb = None
        if args.fit:
            try:
                fit_gb = float(args.fit.strip().upper().removesuffix("GB").strip())
                wi.check_fit(fit_gb)
            except (ValueError, wi.SettingError):
                raise UsageError(f"--fit takes a GPU size in GB from 1 to {1 << 20}, such as "
                                 f"40, not {quoted(args.fit)}") from None
        if args.device is not None and args.device < 0:
            raise UsageError("--device takes a GPU number")
        try:
            ti = wi.trace_input(wi.load(source), args.device)
        except wi.NoHistory as e:
            if args.session:
                raise UsageError("the session recording holds no allocation yet") from None
            if args.trace != "last":
                raise UsageError(str(e)) from None
            raise UsageError("the last traced cell made no allocation on the GPU: there is "
                             "nothing to replay") from None
        except wi.SnapshotError as e:
            raise UsageError(str(e)) from None
        confs = args.conf if args.conf else list(wi.DEFAULT_ALTERNATIVES)
        parsed = []
        current = wi.parse_settings_or_none(ti.recorded_setting)
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
        if extra_notes:
            ti = replace(ti, notes=(*ti.notes, *extra_notes))
        context = None
        if args.fit is not None and (args.session or args.trace == "last"):
            context = self._outside_pytorch_bytes(ti.device)
        result = wi.run(ti, parsed, capacity, fit=args.fit is not None, fit_gb=fit_gb,
                        total_bytes=total, context_bytes=context, progress=wi.Progress(display))
        if args.o:
            return result
        display(*wi.views(result))
        return None

    def _outside_pytorch_bytes(self, device: int) -> int | None:
        """This process's memory on ``device`` outside PyTorch's cache (its CUDA context and
        libraries), read now; None where NVML does not attribute memory to it."""
        try:
            d = self.monitor.read().device(device)
        except Exception:
            return None
        return d.outside_pytorch_bytes if d is not None else None

    def _cmd_start(self, args: Any) -> None:
        self.monitor.sampler.start()
        print(f"gpumem: sampling every {self.monitor.sampler.interval_s:g} s")

    def _cmd_stop(self, args: Any) -> None:
        self.monitor.sampler.stop()
        # The cluster's lines come at the sampler's pace: no sampling, no collecting.
        feed = " and the cluster's lines" if self.monitor.stop_cluster_feed() else ""
        print(f"gpumem: sampler{feed} stopped; cells are still recorded")

    def _collector(self, name: str | None) -> Any:
        """The collector for the user's Dask client: the named variable's, else the current
        client's. Any problem is a UsageError with what to do."""
        try:
            from .cluster import dask_backend
        except ImportError as e:  # a broken install: say so plainly
            raise UsageError(f"the cluster view could not load: {e}") from None
        if name:
            if not name.isidentifier():
                raise UsageError(f"CLIENT is a variable name, not {quoted(name)}")
            user_ns: dict[str, Any] = getattr(self.shell, "user_ns", {})
            if name not in user_ns:
                raise UsageError(f"there is no variable {quoted(name)} in this notebook")
            client = user_ns[name]
            if not dask_backend.is_client(client):
                if importlib.util.find_spec("distributed") is None:
                    raise UsageError(dask_backend.INSTALL_HINT)
                raise UsageError(f"{name} is a {type(client).__name__}, not a "
                                 "distributed.Client")
        else:
            try:
                client = dask_backend.default_client()
            except (ImportError, LookupError) as e:
                raise UsageError(str(e)) from None
        if dask_backend.client_closed(client):
            which = name or "the current Dask client"
            raise UsageError(f"{which} is closed: make a new client (client = Client(...)), "
                             "or name an open one: %gpumem cluster NAME")
        return self.monitor.cluster_collector(client, dask_backend.DaskCollector)

    def _cmd_cluster(self, args: Any) -> Any:
        if not MIN_TIMEOUT_S <= args.timeout <= MAX_TIMEOUT_S:
            raise UsageError(f"--timeout takes seconds from {MIN_TIMEOUT_S:g} to "
                             f"{MAX_TIMEOUT_S:g}")
        from .cluster import ClusterView

        collector = self._collector(args.client)
        reading = collector.collect(args.timeout)
        if args.o:
            return reading
        display(ClusterView(reading))
        return None

    def _cmd_watch(self, args: Any) -> None:
        m = self.monitor
        if args.stop:
            if args.replay is not None or args.live or args.cluster is not None:
                raise UsageError("--stop ends the chart; it goes with none of --replay, "
                                 "--live and --cluster")
            if m.end_chart():
                print("gpumem: chart stopped; each of its outputs is now its picture (a saved "
                      "notebook shows that, with or without a kernel)")
            else:
                print("gpumem: no chart was live; nothing to stop")
            return
        collector = None
        if args.cluster is not None:
            # The cluster's lines are live: they go on this machine's chart, not a replay's.
            if args.replay is not None:
                raise UsageError("--cluster adds live lines; it does not go with --replay")
            if m.replay is not None and not args.live:
                raise UsageError("the chart is replaying a recording: add --live to chart "
                                 "this machine with the cluster's lines")
            collector = self._collector(args.cluster)  # checked before anything starts
        if args.replay is not None:
            try:
                m.start_replay(args.replay)
            except (ValueError, OSError) as e:
                raise UsageError(short_message(f"cannot replay {quoted(args.replay)}: {e}")
                                 ) from None
        elif args.live:
            m.stop_replay()
        if collector is not None:
            m.start_cluster_feed(collector)
        show_chart(m)

    # -- cell magic --------------------------------------------------------------------------
    def _cell(self, argv: list[str], cell: str) -> Any:
        # The body's exception is read by its own nested hook, the OOM explainer and the
        # record: its text once for all of them (errtext).
        with one_read_per_error():
            return self._measured_cell(argv, cell)

    def _measured_cell(self, argv: list[str], cell: str) -> Any:
        args = _parse(self.cell_parser, argv)
        m = self.monitor
        if args.device is not None:
            try:
                m.check_device(_device_arg(str(args.device)))
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
        session = getattr(self.monitor, "session", None)
        tracer = trace.CellTracer(session=session is not None and session.active) \
            if args.trace else None
        why = tracer.start() if tracer is not None else ""
        if why:
            print(f"gpumem --trace: {why}")
            tracer = None
        try:
            result, before, after, wm, did_reset = self._run_measured(cell, args.reset_peak)
        except BaseException:
            # Whatever failed (a KeyboardInterrupt between readings, a bug), allocation
            # history is never left recording; stop() below switches it off otherwise.
            if tracer is not None:
                tracer.disarm()
            raise
        traced = None
        if tracer is not None:
            try:
                traced = tracer.stop(top=args.top or trace.TOP_DEFAULT, save=save)
            except Exception as e:
                m._contain("%%gpumem --trace", e)
                print(f"gpumem --trace: the trace could not be read ({type(e).__name__}).")
        if save is not None and (traced is None or not traced.saved_to):
            # Asked for a file and got none: said even under -q (on stderr, where -q does
            # not reach), as it is among the notes otherwise.
            why = traced.save_failed if traced is not None else \
                f"Nothing was saved to {safeio.shown(save)}: the cell was not traced."
            if args.q or traced is None:
                print(f"gpumem --trace: {why}", file=sys.stderr)
        if traced is not None and traced.snapshot is not None:
            m.last_trace = traced
            m.oom.extra_lines = self._default_oom_lines() or _whatif_lines(traced.snapshot)
        try:  # the monitor's own hook sees only top-level cells; this one ran nested
            m.oom.on_cell_result(result, sites=[SiteAtFailure(label, n) for label, n in (
                traced.sites_at_failure() if traced is not None else ())])
        except BaseException as e:  # a user exception's odd code, contained
            m._contain("OOM explainer", e)
        finally:
            m.oom.extra_lines = self._default_oom_lines()
        if getattr(result, "error_in_exec", None) is not None:
            # The nested run compiled the cell under the shell's next number: the stored
            # exception is this cell's, by its own number.
            m.last_cell_exception.note(m.running_execution_count, result, self.shell)
        if before is None or after is None or wm is None:
            return None
        rec = build_record(
            execution_count=m.running_execution_count, cell_key="%%gpumem",
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

    def _run_measured(self, cell: str, reset_peak: bool) -> tuple[Any, Any, Any, Any, bool]:
        """Run the cell between two exact readings. A reading that fails is reported in one
        line and the cell still runs (unmeasured): the user's code comes first."""
        m = self.monitor
        before = after = wm = None
        did_reset = False
        try:
            m.flush()  # earlier cells the sampler has not recorded yet
            reset = reset_peak or m.config.peak == PEAK_RESET
            # An explicit measurement reads NVML itself, before and after: the sampler's
            # latest reading can predate the cell (a stale "NVML peak" and Δ).
            before, wm, did_reset = m.begin(reset_peak=reset, nvml_now=True)
        except Exception as e:
            m._contain("%%gpumem", e)
            print(f"gpumem: this cell runs unmeasured: reading memory failed "
                  f"({type(e).__name__}).")
            before = None
        shell: Any = self.shell
        result = shell.run_cell(cell, store_history=False)
        if before is not None and wm is not None:
            try:
                after = m.end(wm, nvml_now=True)
            except Exception as e:
                m._contain("%%gpumem", e)
                print(f"gpumem: this cell's end could not be read ({type(e).__name__}).")
        return result, before, after, wm, did_reset


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


def _whatif_lines(snapshot: dict[str, Any]) -> Any:
    """The OOM explainer's what-if line for a traced cell: replayed with expandable segments,
    at the memory PyTorch could use when the request failed."""
    from .whatif.api import expandable_oom_line

    def lines(facts: Any) -> list[str]:
        if facts.backend != "native" or facts.expandable_segments or facts.larger_than_gpu:
            return []
        cap = None
        if facts.free_bytes is not None and facts.reserved_bytes is not None:
            cap = facts.free_bytes + facts.reserved_bytes
        return [expandable_oom_line(snapshot, device=facts.device, capacity_bytes=cap,
                                    allowed_bytes=facts.allowed_bytes)]

    return lines


def _session_whatif_lines(recorder: Any) -> Any:
    """The OOM explainer's what-if line while a session is recorded: the whole session
    replayed with expandable segments from its recorded start."""
    from .whatif.api import expandable_oom_line

    def lines(facts: Any) -> list[str]:
        if facts.backend != "native" or facts.expandable_segments or facts.larger_than_gpu:
            return []
        got = recorder.snapshot()
        if got is None:
            return []
        cap = None
        if facts.free_bytes is not None and facts.reserved_bytes is not None:
            cap = facts.free_bytes + facts.reserved_bytes
        return [expandable_oom_line(got.snapshot, device=facts.device, capacity_bytes=cap,
                                    allowed_bytes=facts.allowed_bytes)]

    return lines


# ------------------------------------------------------------------------------------------
# Extension entry points
# ------------------------------------------------------------------------------------------
def _stop_at_exit(ref: Any) -> None:
    monitor = ref()
    if monitor is not None:
        with contextlib.suppress(Exception):
            # The process is ending: the chart's outputs can no longer be replaced, and a
            # message to a closed socket logs an error. Forget the chart; stop the threads.
            monitor.widget = None
            monitor.stop_replay()
            monitor.sampler.stop(timeout_s=0.5)


def show_chart(monitor: Monitor) -> Any:
    """Display the kernel's chart: its live view and its picture (``MemoryWidget.display``).
    Every display of one chart shares their two display_ids, so when the chart ends each of
    them is replaced by its picture."""
    from .widget import show

    widget = show(monitor)
    widget.display(display, monitor.shell)
    return widget


def current_monitor(shell: Any = None) -> Monitor | None:
    if shell is None:
        from IPython import get_ipython

        shell = get_ipython()
    return getattr(shell, _SHELL_ATTR, None) if shell is not None else None


def load(shell: Any) -> None:
    if current_monitor(shell) is not None:
        return  # already loaded: one monitor, one thread, one set of callbacks
    # History and settings survive %reload_ext; a first load reads the settings file (which
    # never raises: bad values are reported and replaced by defaults).
    history = getattr(shell, _HISTORY_ATTR, None)
    config = getattr(shell, _CONFIG_ATTR, None)
    devices: tuple[DeviceChoice, ...] = ()
    if config is None:
        loaded = load_settings(getattr(shell, "config", None))
        config, devices = loaded.config, loaded.devices
    keys = getattr(shell, _SESSION_KEYS_ATTR, None)
    monitor = Monitor(shell, history=history, config=config,
                      session_keys=keys if isinstance(keys, set) else None,
                      starting_devices=devices)
    monitor.oom.show = display  # rich output in notebooks, text in terminals
    kept = getattr(shell, _RECORDED_ATTR, None)
    if kept is not None:
        # The session %reload_ext switched off: still there for --session, as the history is.
        setattr(monitor, "session", kept)  # noqa: B010 - monitor.py is issue 26's file
        delattr(shell, _RECORDED_ATTR)
    magics: GpumemMagics | None = None
    try:
        line = monitor.start()
        shell.events.register("pre_run_cell", monitor.pre_run_cell)
        shell.events.register("post_run_cell", monitor.post_run_cell)
        # ipykernel sets exit_now while it handles a shutdown or restart request, before it
        # replies: the chart can still turn its outputs into pictures then.
        if hasattr(shell, "observe"):
            shell.observe(monitor.on_shell_exit, names="exit_now")
        magics = GpumemMagics(shell, monitor)
        shell.register_magics(magics)
        _add_traits(shell, monitor)
        setattr(shell, _SHELL_ATTR, monitor)
        # Stop sampling before the kernel closes its sockets: a last tick publishing to a
        # closed socket logs an error at exit.
        atexit.register(_stop_at_exit, weakref.ref(monitor))
        setattr(shell, _MAGICS_ATTR, magics)
        setattr(shell, _HISTORY_ATTR, monitor.history)
        setattr(shell, _CONFIG_ATTR, monitor.config)
        setattr(shell, _SESSION_KEYS_ATTR, monitor.session_keys)
    except BaseException:
        # A load that fails part-way takes back what it did: no sampler thread, no
        # callbacks, no magic left behind on a monitor nobody can reach.
        _teardown(shell, monitor, magics)
        raise
    print(line)
    if monitor.config.auto_show:
        try:
            show_chart(monitor)
        except Exception as e:
            monitor._contain("auto-show", e)


def _add_traits(shell: Any, monitor: Monitor) -> None:
    """The settings as the ``GpumemNb`` configurable, for ``%config GpumemNb``: its traits
    mirror the monitor's settings (a listener), and a trait set there goes through
    ``Monitor.configure``, the one writer."""
    traits = GpumemNb(monitor.config, monitor.configure, monitor.check_device)
    monitor.settings_listeners.append(traits.mirror)
    configurables = getattr(shell, "configurables", None)
    if isinstance(configurables, list):
        configurables.append(traits)
    setattr(shell, _TRAITS_ATTR, traits)


def unload(shell: Any) -> None:
    monitor = current_monitor(shell)
    if monitor is None:
        return
    _teardown(shell, monitor, getattr(shell, _MAGICS_ATTR, None))


def _teardown(shell: Any, monitor: Monitor, magics: GpumemMagics | None) -> None:
    """Undo a load, every step on its own: what one step failed to undo must not keep the
    next from running. Leaves nothing that references ``monitor``."""
    for event, fn in (("pre_run_cell", monitor.pre_run_cell),
                      ("post_run_cell", monitor.post_run_cell)):
        with contextlib.suppress(Exception):
            shell.events.unregister(event, fn)
    with contextlib.suppress(Exception):
        shell.unobserve(monitor.on_shell_exit, names="exit_now")
    recorder = getattr(monitor, "session", None)
    if recorder is not None and recorder.on:
        with contextlib.suppress(Exception):  # unloaded, nothing of ours keeps recording
            recorder.stop()
    if recorder is not None and recorder.kept is not None:
        with contextlib.suppress(Exception):
            setattr(shell, _RECORDED_ATTR, recorder)
    monitor.shutdown()
    manager = getattr(shell, "magics_manager", None)
    if manager is not None:
        for kind in ("line", "cell"):
            fn = manager.magics.get(kind, {}).get("gpumem")
            if magics is not None and getattr(fn, "__self__", None) is magics:
                manager.magics[kind].pop("gpumem", None)
        if magics is not None and manager.registry.get(type(magics).__name__) is magics:
            del manager.registry[type(magics).__name__]
    traits = getattr(shell, _TRAITS_ATTR, None)
    if traits is not None and getattr(traits, "_configure", None) != monitor.configure:
        traits = None  # another load's
    if magics is not None or traits is not None:
        # IPython's Magics.__init__ appends every instance to shell.configurables and nothing
        # ever removes it: without this, each %reload_ext kept the old monitor (its history
        # buffers, sources and file descriptors) alive for the life of the kernel. The
        # GpumemNb configurable holds the monitor's configure: it goes too.
        configurables = getattr(shell, "configurables", [])
        configurables[:] = [c for c in configurables if c is not magics and c is not traits]
    if magics is not None:
        magics.monitor = None  # type: ignore[assignment]
    for attr in (_SHELL_ATTR, _MAGICS_ATTR, _TRAITS_ATTR):
        if getattr(shell, attr, None) in (monitor, magics, traits) and hasattr(shell, attr):
            delattr(shell, attr)
