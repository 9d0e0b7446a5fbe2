"""A user's exception is the user's code: the hooks must survive whatever it does.

Found by the closing attack on issue 16. Each test runs IPython's real shell with the
extension loaded and raises, in a cell, an exception whose own code misbehaves: a
``__str__`` raising ``SystemExit`` (which ended the kernel: IPython contains only
``Exception`` from a callback), ``GeneratorExit`` or ``KeyboardInterrupt``; a ``__getattr__``
raising ``KeyError`` (every later cell went unrecorded); ``__cause__``/``__context__``
properties that raise; a ``__str__`` returning a ``str`` subclass whose methods raise; a
metaclass whose ``__name__`` raises; a ``__bool__`` that raises in the chain (the OOM behind
it went unexplained); and a ``__str__`` that counts its calls (7 per failing cell, against
IPython's own 3).
"""

from __future__ import annotations

import builtins
import sys
import textwrap
from typing import Any

import pytest

from gpumem_nb.kernel import Monitor, current_monitor

from .fakes import GiB, OutOfMemoryError
from .helpers import ipython_8_for, run, spaced

HOSTILE = textwrap.dedent("""\
    class StrExits(Exception):
        def __str__(self):
            raise SystemExit("from __str__")
    class StrGenExit(Exception):
        def __str__(self):
            raise GeneratorExit("from __str__")
    class StrInterrupts(Exception):
        def __str__(self):
            raise KeyboardInterrupt
    class ProxyError(Exception):
        '''Forwards unknown attributes to a payload dict: KeyError when absent.'''
        def __init__(self, payload):
            super().__init__("request failed")
            self.payload = payload
        def __getattr__(self, name):
            return self.payload[name]
    class CauseProp(Exception):
        @property
        def __cause__(self):
            raise RuntimeError("cause property")
    class ContextProp(Exception):
        @property
        def __context__(self):
            raise RuntimeError("context property")
    class Hostile(str):
        def __getitem__(self, k): raise RuntimeError("str getitem")
        def __len__(self): raise RuntimeError("str len")
        def __contains__(self, k): raise RuntimeError("str contains")
        def lstrip(self, *a): raise RuntimeError("lstrip")
        def splitlines(self, *a): raise RuntimeError("splitlines")
    class StrSub(Exception):
        def __str__(self):
            return Hostile("CUDA out of memory. Tried to allocate 1.00 GiB.")
    class Meta(type):
        @property
        def __name__(cls):
            raise RuntimeError("metaclass __name__")
    class MetaNamed(Exception, metaclass=Meta):
        pass
    class BoolRaises(Exception):
        def __bool__(self):
            raise RuntimeError("no truth value")
    class Counted(Exception):
        calls = 0
        def __str__(self):
            Counted.calls += 1
            return "counted"
    """)

NATIVE = ("CUDA out of memory. Tried to allocate 400.00 GiB. GPU 0 has a total capacity of "
          "139.80 GiB of which 134.29 GiB is free.")


def monitor(ip: Any) -> Monitor:
    m = current_monitor(ip)
    assert m is not None
    return m


@pytest.fixture
def loaded(loaded: Any, capsys: Any) -> Any:
    """The conftest's, with the hostile classes defined in a cell the sampler has read."""
    loaded.user_ns.update(NATIVE=NATIVE, OutOfMemoryError=OutOfMemoryError)
    run(loaded, HOSTILE)
    spaced(loaded)
    capsys.readouterr()
    return loaded


def recorded_sources(ip: Any) -> list[str]:
    return [r.source_preview for r in monitor(ip).history.records()]


def no_traceback_of_ours(capsys: Any) -> None:
    out = capsys.readouterr()
    assert "gpumem_nb/" not in out.out + out.err, (out.out + out.err)[-2000:]
    assert "failed (reported once)" not in out.out + out.err


# ------------------------------------------------------------------------------------------
# D1: a __str__ that raises SystemExit, GeneratorExit or KeyboardInterrupt
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", ["StrExits", "StrGenExit", "StrInterrupts"])
@pytest.mark.parametrize("magic", ["", "%%gpumem -q\n"])
def test_an_exception_whose_str_raises_system_exit_does_not_leave_the_cell(loaded, capsys,
                                                                          cls, magic, caplog):
    # Before: the SystemExit left run_cell from our post_run_cell (a real kernel exited).
    result = run(loaded, f"{magic}raise {cls}()", cell_id=f"c-{cls}")
    if magic:  # the body's error was shown by its own run; the magic itself raised nothing
        assert result.error_in_exec is None, repr(result.error_in_exec)
    else:
        assert result.error_in_exec is not None
    after = run(loaded, "alive = 1", cell_id="next")
    assert after.error_in_exec is None and loaded.user_ns["alive"] == 1
    records = monitor(loaded).history.records()
    assert records[-1].source_preview == "alive = 1"
    assert records[-2].source_preview == (magic.strip() or f"raise {cls}()")  # kept
    assert not [r for r in caplog.records if "failed (reported once)" in r.getMessage()]


# ------------------------------------------------------------------------------------------
# D2: a __getattr__ that raises, raising __cause__/__context__ properties
# ------------------------------------------------------------------------------------------
def test_an_exception_whose_getattr_raises_does_not_stop_later_cells_being_recorded(
        loaded, capsys):
    before = len(monitor(loaded).history.records())
    run(loaded, "raise ProxyError({'code': 500})", cell_id="proxy")
    for i in range(5):
        run(loaded, f"b{i} = {i}", cell_id=f"b{i}")
    sources = recorded_sources(loaded)[before:]
    # Before: only the failing cell was recorded; exception_chain asked it for
    # ``exceptions`` on every later cell, and its __getattr__ raised KeyError.
    assert sources == ["raise ProxyError({'code': 500})", *(f"b{i} = {i}" for i in range(5))]
    no_traceback_of_ours(capsys)


def test_cleanup_dry_run_after_an_exception_whose_getattr_raises_reports_not_raises(
        loaded, capsys):
    run(loaded, "raise ProxyError({'code': 500})", cell_id="proxy")
    capsys.readouterr()
    for line in ("cleanup --dry-run", "who", "cleanup"):
        loaded.run_line_magic("gpumem", line)  # a KeyError from cleanup.py before
    out = capsys.readouterr()
    # IPython itself trips over such an exception while formatting it and stores its own
    # error in its place; whichever it stores, cleanup names it and drops it.
    assert "would drop the stored" in out.out and "dropped the stored" in out.out
    assert "gpumem_nb/" not in out.out + out.err


@ipython_8_for("lets such an exception out of run_cell: its traceback formatter reads "
               "__cause__ and __context__ unguarded")
@pytest.mark.parametrize("cls", ["CauseProp", "ContextProp"])
def test_raising_cause_or_context_properties_keep_records_and_cleanup_working(loaded, capsys,
                                                                             cls):
    before = len(monitor(loaded).history.records())
    run(loaded, f"raise {cls}('x')", cell_id=cls)
    run(loaded, "after = 1", cell_id="after")
    assert recorded_sources(loaded)[before:] == [f"raise {cls}('x')", "after = 1"]
    run(loaded, f"raise {cls}('x')", cell_id=cls)
    capsys.readouterr()
    loaded.run_line_magic("gpumem", "cleanup --dry-run")
    assert "would drop the stored" in capsys.readouterr().out
    no_traceback_of_ours(capsys)


# ------------------------------------------------------------------------------------------
# D3: a str subclass from __str__, a metaclass whose __name__ raises
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("magic", ["", "%%gpumem\n"])
def test_a_str_subclass_whose_methods_raise_keeps_the_record_and_report_line(loaded, capsys,
                                                                            magic):
    result = run(loaded, f"{magic}raise StrSub()", cell_id="strsub")
    out = capsys.readouterr()
    if magic:
        assert result.error_in_exec is None, result.error_in_exec
        assert " ms · " in out.out  # the report line
    else:
        rec = monitor(loaded).history.records()[-1]
        assert rec.raised
        assert rec.error == "StrSub: CUDA out of memory. Tried to allocate 1.00 GiB."
    assert "gpumem_nb/" not in out.out + out.err


@ipython_8_for("lets such an exception out of run_cell (a cell magic's body's too): its "
               "traceback formatter reads the type's __name__ unguarded")
@pytest.mark.parametrize("magic", ["", "%%gpumem\n"])
def test_a_metaclass_whose_name_raises_keeps_the_record_and_report_line(loaded, capsys,
                                                                       magic):
    # Before: %%gpumem printed a traceback from on_cell_result (type(err).__name__).
    result = run(loaded, f"{magic}raise MetaNamed('x')", cell_id="meta")
    out = capsys.readouterr()
    if magic:
        assert result.error_in_exec is None, result.error_in_exec
        assert " ms · " in out.out
    else:  # IPython 9 stores its own RuntimeError for it; the record says what it stored
        rec = monitor(loaded).history.records()[-1]
        assert rec.raised and rec.source_preview == "raise MetaNamed('x')"
    assert "gpumem_nb/" not in out.out + out.err


# ------------------------------------------------------------------------------------------
# D13: a __bool__ that raises in the chain
# ------------------------------------------------------------------------------------------
@ipython_8_for("can let such a chain out of run_cell: its traceback formatter asks the "
               "cause's truth value unguarded")
def test_an_exception_whose_bool_raises_in_the_chain_still_lets_the_oom_be_explained(
        loaded, capsys, caplog):
    m = monitor(loaded)
    m.oom.last = None
    run(loaded, textwrap.dedent("""\
        try:
            raise OutOfMemoryError(NATIVE)
        except Exception:
            raise RuntimeError('outer') from BoolRaises('wrapper')
        """))
    # Before: ``exc.__cause__ or exc.__context__`` asked the wrapper's __bool__: two
    # "failed (reported once)" warnings and no explanation.
    assert m.oom.last is not None and m.oom.last.facts.requested_bytes == 400 * GiB
    assert not [r for r in caplog.records if "failed (reported once)" in r.getMessage()]
    assert monitor(loaded).history.records()[-1].raised


# ------------------------------------------------------------------------------------------
# D14: the failing cell's text, once
# ------------------------------------------------------------------------------------------
def test_a_failing_cells_str_is_called_once_by_the_extension(shell, fake_gpu, capsys):
    run(shell, HOSTILE)
    counted = shell.user_ns["Counted"]
    run(shell, "raise Counted()")
    bare = counted.calls  # IPython's own calls (3 with IPython 9)
    run(shell, "%load_ext gpumem_nb")
    counted.calls = 0
    run(shell, "raise Counted()")
    assert counted.calls == bare + 1, (bare, counted.calls)  # 7 against 3 before
    counted.calls = 0
    run(shell, "%%gpumem -q\nraise Counted()")
    assert counted.calls <= bare + 1


# ------------------------------------------------------------------------------------------
# userexc itself, table-driven
# ------------------------------------------------------------------------------------------
def _namespace() -> dict[str, Any]:
    ns: dict[str, Any] = {}
    exec(HOSTILE, ns)
    return ns


def test_userexc_reads_every_hostile_exception_without_raising():
    from gpumem_nb import userexc

    ns = _namespace()
    cases = [ns["StrExits"](), ns["StrGenExit"](), ns["StrInterrupts"](),
             ns["ProxyError"]({}), ns["CauseProp"]("x"), ns["ContextProp"]("x"),
             ns["StrSub"](), ns["MetaNamed"]("x"), ns["BoolRaises"]("x")]
    for exc in cases:
        text = userexc.text(exc)
        assert type(text) is str
        assert userexc.chain(exc, 8) == [exc]
        assert userexc.members(exc) == ()
        assert isinstance(userexc.type_name(exc), str)
        userexc.parts(exc)
    assert userexc.type_name(ns["MetaNamed"]("x")) == "MetaNamed"
    assert userexc.text(ns["StrSub"]()) == "CUDA out of memory. Tried to allocate 1.00 GiB."


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception groups are 3.11+")
def test_userexc_chain_follows_cause_context_and_group_members_each_once():
    from gpumem_nb import userexc

    group_type: Any = getattr(builtins, "ExceptionGroup", None)
    inner = ValueError("inner")
    mid = KeyError("mid")
    mid.__context__ = inner
    top = RuntimeError("top")
    top.__cause__ = mid
    top.__context__ = inner
    group = group_type("g", [top, ValueError("member")])
    found = userexc.chain(group, 10)
    assert found[0] is group and top in found and mid in found and inner in found
    assert len(found) == len({id(e) for e in found}) == 5
    a, b = ValueError("a"), ValueError("b")
    a.__context__, b.__context__ = b, a  # a cycle
    assert userexc.chain(a, 10) == [a, b]
    assert len(userexc.chain(group, 2)) == 2


def test_error_str_calls_str_once_per_exception_within_a_cells_hooks():
    from gpumem_nb.errtext import error_str, one_read_per_error

    ns = _namespace()
    counted = ns["Counted"]
    e = counted()
    with one_read_per_error():
        assert [error_str(e) for _ in range(5)] == ["counted"] * 5
    assert counted.calls == 1
    assert error_str(e) == "counted" and counted.calls == 2  # outside the hooks: afresh
