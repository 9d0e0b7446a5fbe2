"""The grammar of ``%gpumem`` / ``%%gpumem``: splitting the line, the argparse machinery, the
help text, and the messages every refused input ends in.

Every input to %gpumem / %%gpumem ends in a result or a UsageError with a plain sentence:
argparse's own errors come through ``Parser.error``, values are checked by the same functions
that guard the settings file (``LiveSettings.configure``), and tests/test_fuzz_magics.py holds
this. The subcommands themselves, each with its flags, are in ``commands/``.
"""

from __future__ import annotations

import argparse
import difflib
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic_arguments import MagicArgumentParser

from ..kernel import Monitor
from ..units import ECHO_CHARS, echo_cut, format_bytes, parse_size, printable, quoted

__all__ = [
    "MAX_LINE_CHARS",
    "MAX_MESSAGE_CHARS",
    "MAX_PARSED_WORDS",
    "Parser",
    "Subcommand",
    "device_arg",
    "help_text",
    "parse",
    "short_message",
    "size_flag",
    "split",
    "subparsers",
]

MAX_MESSAGE_CHARS = 400


class _Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str) -> None:
        # A fixed width: %gpumem? reads the same in every terminal and notebook.
        super().__init__(prog, width=92, max_help_position=28)


class Parser(MagicArgumentParser):
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
            hint = did_you_mean(typed.strip("'\""), subparsers(self))
            raise UsageError(f"%gpumem has no subcommand {echo_cut(typed)}; "
                             f"{hint or 'try %gpumem? for the list'}")
        # Most of argparse's messages quote the user's word (repr); "ambiguous option: --x
        # could match" echoes it as typed.
        raise UsageError(short_message(f"{self.prog}: {printable(message)}"))


@dataclass(frozen=True)
class Subcommand:
    """One ``%gpumem`` subcommand: its name and one-line help, the flags it takes (declared
    beside the handler that reads them) and the handler, given the magics' monitor, the
    shell and the parsed flags."""

    name: str
    help: str
    arguments: Callable[[Parser], None]
    run: Callable[[Monitor, InteractiveShell, argparse.Namespace], Any]


def build_parser(commands: Sequence[Subcommand]) -> Parser:
    """The line magic's parser: one subparser for each of ``commands``, in order."""
    p = Parser(prog="%gpumem", add_help=False)
    sub = p.add_subparsers(dest="cmd", parser_class=Parser, metavar="SUBCOMMAND")
    for command in commands:
        sp = sub.add_parser(command.name, prog=f"%gpumem {command.name}", help=command.help,
                            description=command.help)
        command.arguments(sp)
    return p


def did_you_mean(typed: str, known: Any) -> str:
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
                 and (h := did_you_mean(w.split("=", 1)[0], flags))), "")
    tail = f"; {hint}" if hint else ""
    return short_message(head + " ".join(shown), MAX_MESSAGE_CHARS - len(tail)) + tail


# No command takes more than a few dozen words, and argparse's own loop costs the square of
# the flags it is given (5,000 unknown flags: 0.35 s of a 0.46 s refusal): it reads at most
# this many, and a longer line is refused for what those words already hold.
MAX_PARSED_WORDS = 200


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> Any:
    """``parser.parse_args``, but an unknown flag gets the closest known one suggested (the
    subcommand's own flags: argparse reports extras from the top parser, which knows none)."""
    read = MAX_PARSED_WORDS
    if len(argv) > read and argv[read - 1].startswith("-"):
        read += 1  # the last flag read keeps the value that follows it
    args, extras = parser.parse_known_args(argv[:read])
    chosen = subparsers(parser).get(getattr(args, "cmd", None) or "", parser)
    if extras:
        raise UsageError(_unknown_flags_error(chosen.prog, chosen, extras))
    if len(argv) > read:
        raise UsageError(f"{chosen.prog}: {len(argv):,} words is more than any command "
                         f"takes (at most {MAX_PARSED_WORDS})")
    return args


def subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
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


def help_text(parser: argparse.ArgumentParser, cell_parser: argparse.ArgumentParser,
              subcommand: str | None = None) -> str:
    """``%gpumem?``, written from the parsers themselves so it cannot drift from them."""
    subs = subparsers(parser)
    if subcommand in subs:
        return _section(subs[subcommand])
    parts = ["Watch, explain and clean up GPU memory.", "",
             "Line magic: %gpumem [SUBCOMMAND] [options]   (-h after a subcommand: its help)"]
    parts += [_section(sp) + "\n" for sp in subs.values()]
    parts += ["Cell magic:", _section(cell_parser), "", _OOM_NOTE, "", _PEAKS_NOTE, ""]
    return "\n".join(parts)


# No command's line comes near this (a path, a few settings, a list of names), and shlex
# grows a word one character at a time: a 100,000-character flag took 2.8 s to split,
# 1,000,000 took 124 s. A longer line is refused before it is split.
MAX_LINE_CHARS = 10_000


def split(line: str) -> list[str]:
    if len(line) > MAX_LINE_CHARS:
        raise UsageError(f"%gpumem: the line is {len(line):,} characters long, more than any "
                         f"command takes (at most {MAX_LINE_CHARS:,})")
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


def device_arg(text: str) -> int | None:
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


def short_message(message: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """A message holding the user's words (argparse quotes them whole): every word longer
    than ``ECHO_CHARS`` cut, and the whole at most ``limit`` characters, its "…" included."""
    if len(message) <= min(ECHO_CHARS, limit):
        return message
    words = re.sub(rf"\S{{{ECHO_CHARS + 1},}}", lambda m: echo_cut(m.group(0)), message)
    return words if len(words) <= limit else words[: limit - 1] + "…"




def size_flag(flag: str, text: str, most: int) -> int:
    """A flag's size (``--capacity 40GiB``): above zero, at most ``most`` bytes; a negative
    one is refused with the same sentence as zero."""
    try:
        size = 0 if text.strip().startswith("-") else parse_size(text)
    except ValueError as e:
        raise UsageError(short_message(f"{flag}: {e}")) from None
    if not 0 < size <= most:
        raise UsageError(f"{flag} must be a size above zero and at most "
                         f"{format_bytes(most)}, not {quoted(text)}")
    return size
