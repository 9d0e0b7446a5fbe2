"""Every input to %gpumem and %%gpumem ends in a result or a UsageError, and a UsageError
changes nothing.

Hypothesis builds argument lines from each subcommand's real flags (and the other
subcommands' flags, and junk flags) with junk values: numbers too large for a float, NaN,
negative counts, NUL characters, unbalanced quotes, special files as paths. Any other
exception escaping the magic fails the test, as does a UsageError after which the settings,
the sampler, the source, the history, the namespace, the settings file or the files on disk
differ from before.

Paths are drawn only from a private directory (the test runs there) and a few special files:
random text never contains "/", so nothing outside it can be written.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from IPython.core.error import UsageError

from gpumem_nb.ipython.commands import build_cell_parser as _build_cell_parser
from gpumem_nb.ipython.commands import build_line_parser as _build_parser
from gpumem_nb.kernel import current_monitor

pytestmark = pytest.mark.slow  # hypothesis over the magic grammar

FUZZ = settings(max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


def subparsers() -> dict[str, argparse.ArgumentParser]:
    for action in _build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no subcommands")


SUBCOMMANDS = subparsers()
ALL_FLAGS = sorted({f for p in [*SUBCOMMANDS.values(), _build_cell_parser()]
                    for a in p._actions for f in a.option_strings})
JUNK_FLAGS = ["--", "-", "--bogus", "-x", "--traceback", "--device=1", "--interval=nan", "-n5",
              "-h", "--save"]

# Values that have broken parsers before, and values that are merely valid.
EDGE_VALUES = [
    "0", "1", "2", "-1", "-0", "99", "all", "nan", "NaN", "inf", "-inf", "1e400", "-1e400",
    "1e-400", "0.05", "0.049", "60", "60.1", "1e30", "64MB", "1GiB", "2PB", "-5", "5e-324",
    "9" * 5000, "x" * 3000, "", " ", "'", '"', "\\", "\0", "a\0b", "bundled", "on", "off",
    "preserve",
    # "fz_a,fz_a" (a duplicate name) belongs here once cleanup's --vars fix is merged.
    "reset", "fz_a", "fz_a,nope", "a b", "\u0663", "1_000", "0x10", "١٢",
    "\udcff", "\ud800", "out.csv", "FIFO", "DEVZERO", "DIR", "LINK", "missing/x.csv",
]
text = st.text(alphabet=st.characters(blacklist_characters="/", blacklist_categories=("Cs",)),
               max_size=12)
# Edge values half the time: random text alone would rarely hit the few that matter.
values = st.one_of(st.sampled_from(EDGE_VALUES), st.sampled_from(EDGE_VALUES),
                   st.sampled_from(EDGE_VALUES), text, st.integers().map(str),
                   st.floats().map(repr))


def argv_for(flags: list[str]) -> st.SearchStrategy[list[str]]:
    flag_value = st.tuples(st.sampled_from(flags), values).map(list)
    token = st.one_of(
        flag_value, flag_value, flag_value,
        st.sampled_from(flags).map(lambda f: [f]),
        st.sampled_from(JUNK_FLAGS + ALL_FLAGS).map(lambda f: [f]),
        values.map(lambda v: [v]),
    )
    return st.lists(token, max_size=4).map(lambda ts: [w for t in ts for w in t])


def joined(argv: list[str], raw: bool) -> str:
    # Raw joining yields unbalanced quotes and stray backslashes; shlex.join never does.
    return " ".join(argv) if raw else shlex.join(argv)


@pytest.fixture
def world(shell: Any, two_fake_gpus: Any, tmp_path: Any, monkeypatch: Any, capsys: Any) -> Any:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "victim").write_text("precious")
    (tmp_path / "link.csv").symlink_to(tmp_path / "victim")
    special = {"FIFO": str(tmp_path / "pipe"), "DEVZERO": "/dev/zero", "DIR": str(tmp_path),
               "LINK": str(tmp_path / "link.csv")}
    shell.run_cell("%load_ext gpumem_nb")
    shell.user_ns["cuda"] = two_fake_gpus
    capsys.readouterr()
    return shell, special, tmp_path


def prepared(argv: list[str], special: dict[str, str], shell: Any) -> list[str]:
    out = []
    for word in argv:
        word = special.get(word, word)
        # --vars may name only the sacrificial variable or names that do not exist: deleting
        # the shell's own names is cleanup's business (tests/test_holders.py), not the parser's.
        if out and out[-1] == "--vars":
            word = ",".join(n if n == "fz_a" or n not in shell.user_ns else f"fz_{n}"
                            for n in word.split(","))
        out.append(word)
    return out


def state(shell: Any, private_settings: Any, tmp_path: Any) -> Any:
    mon = current_monitor(shell)
    selected = getattr(mon.source, "selected", None)
    return (
        dataclasses.astuple(mon.config), mon.sampler.interval_s, mon.tracker.threshold_bytes,
        None if selected is None else list(selected), id(mon.source), mon.sampler.running,
        len(mon.history), id(mon.widget),
        {k: id(v) for k, v in shell.user_ns.items()},
        private_settings.read_bytes() if private_settings.exists() else None,
        sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")),
        (tmp_path / "victim").read_text(),
    )


def check(call: Any, shell: Any, private_settings: Any, tmp_path: Any) -> str:
    """Run one input; 'ok' or 'usage'. Anything else escaping fails the test."""
    shell.user_ns["fz_a"] = shell.user_ns.get("fz_a", [1])
    # Earlier cells still waiting for the sampler are recorded now, not counted as this
    # input's doing.
    current_monitor(shell).flush()
    before = state(shell, private_settings, tmp_path)
    try:
        call()
    except UsageError as e:
        assert str(e) and "Traceback" not in str(e)
        assert len(str(e)) <= 400, str(e)[:500]  # refused values are cut, never echoed whole
        assert state(shell, private_settings, tmp_path) == before, str(e)
        return "usage"
    return "ok"


def value_flags(p: argparse.ArgumentParser) -> list[str]:
    return [a.option_strings[-1] for a in p._actions if a.option_strings and a.nargs != 0]


def test_every_flag_with_every_edge_value_is_a_result_or_a_usage_error(world, private_settings,
                                                                      capsys):
    """The exhaustive sweep: each flag that takes a value, of each subcommand and of the cell
    magic, with each edge value, once. Deterministic, so a known breaker is never missed."""
    shell, special, tmp_path = world
    tried = 0
    for sub, parser in [*SUBCOMMANDS.items(), ("%%", _build_cell_parser())]:
        for flag in value_flags(parser):
            for value in EDGE_VALUES:
                argv = prepared([flag, value], special, shell)
                line = shlex.join(argv if sub == "%%" else [sub, *argv])

                def call(line: str = line, cell: bool = sub == "%%") -> Any:
                    if cell:
                        return shell.run_cell_magic("gpumem", line, "fz_x = 1")
                    return shell.run_line_magic("gpumem", line)

                try:
                    check(call, shell, private_settings, tmp_path)
                except AssertionError:
                    raise
                except Exception as e:
                    raise AssertionError(f"{sub} {flag} {value!r}: {type(e).__name__}: {e}"
                                         ) from e
                capsys.readouterr()
                tried += 1
    assert tried > 500


@pytest.mark.parametrize("sub", sorted(SUBCOMMANDS))
def test_every_subcommand_input_is_a_result_or_a_usage_error_that_changes_nothing(
        world, private_settings, capsys, sub):
    shell, special, tmp_path = world
    own = [f for a in SUBCOMMANDS[sub]._actions for f in a.option_strings] or ["-h"]
    outcomes = []

    @settings(FUZZ, max_examples=60)
    @given(argv=argv_for(own), raw=st.booleans())
    def one(argv: list[str], raw: bool) -> None:
        line = joined([sub, *prepared(argv, special, shell)], raw)
        outcomes.append(check(lambda: shell.run_line_magic("gpumem", line), shell,
                              private_settings, tmp_path))
        capsys.readouterr()

    one()
    assert "usage" in outcomes  # the junk really reached the checks
    assert shell.run_cell("probe = 1").success  # and the extension still records cells
    assert current_monitor(shell).history.last().source_preview == "probe = 1"


@FUZZ
@given(words=st.lists(st.one_of(st.sampled_from(sorted(SUBCOMMANDS)), values,
                                st.sampled_from(ALL_FLAGS + JUNK_FLAGS)), max_size=5),
       raw=st.booleans())
def test_any_line_at_all_is_a_result_or_a_usage_error(world, private_settings, capsys, words,
                                                      raw):
    shell, special, tmp_path = world
    line = joined(prepared(words, special, shell), raw)
    check(lambda: shell.run_line_magic("gpumem", line), shell, private_settings, tmp_path)
    capsys.readouterr()


@FUZZ
@given(argv=argv_for([f for a in _build_cell_parser()._actions for f in a.option_strings]),
       raw=st.booleans())
def test_any_cell_magic_line_is_a_result_or_a_usage_error_that_runs_nothing(
        world, private_settings, capsys, argv, raw):
    shell, special, tmp_path = world
    shell.user_ns.setdefault("fz_runs", 0)
    runs = shell.user_ns["fz_runs"]
    line = joined(prepared(argv, special, shell), raw)
    outcome = check(lambda: shell.run_cell_magic("gpumem", line, "fz_runs += 1"), shell,
                    private_settings, tmp_path)
    try:
        words = shlex.split(line)
    except ValueError:
        words = []
    help_only = "-h" in words or "--help" in words
    assert shell.user_ns["fz_runs"] == runs + (outcome == "ok" and not help_only)
    capsys.readouterr()
