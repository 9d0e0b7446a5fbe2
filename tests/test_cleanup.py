"""`%gpumem cleanup` in IPython's real shell: it frees what it names and changes nothing else.

Each test is one way the cleanup used to destroy or change the user's data (issue 8), offer an
exception the user never raised (issue 7), or report a drop it did not make (issue 11).
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
from IPython.core.error import UsageError

from gpumem_nb.kernel import current_monitor

from .fakes import FakeTensor, GiB, MiB
from .helpers import magic, run


def step(report: Any, name: str) -> Any:
    return next(s for s in report.steps if s.step == name)


def output_cell(ip: Any, source: str) -> int:
    """Run a cell that displays a value; return its number (its Out key)."""
    n = ip.execution_count
    run(ip, source)
    assert n in ip.user_ns["Out"], source
    return n


# -- --out keeps what the user assigned --------------------------------------------------------
def test_cleanup_out_keeps_the_underscore_names_the_user_assigned(loaded, fake_gpu):
    ns = loaded.user_ns
    n = output_cell(loaded, "cuda.tensor(64 * 2**20)")
    m = output_cell(loaded, "'shown'")
    run(loaded, f"_{n} = 'mine'; _ = ['my', 'list']")
    mine, lst = ns[f"_{n}"], ns["_"]
    report = magic(loaded, "cleanup --out -o")
    assert ns[f"_{n}"] is mine and ns["_"] is lst and lst == ["my", "list"]
    # What the cache put there is gone, and so is the tensor only the cache held.
    assert f"_{m}" not in ns and ns["Out"] == {} and ns["__"] == ""
    assert fake_gpu.cuda.devices[0].allocated == 0
    did = step(report, "output cache").did
    assert f"kept _, _{n} (yours)" in did


def test_after_cleanup_out_ipython_still_leaves_a_user_underscore_alone(loaded):
    ns = loaded.user_ns
    output_cell(loaded, "41")
    run(loaded, "_ = 'mine'")
    magic(loaded, "cleanup --out")
    k = output_cell(loaded, "42")
    assert ns["_"] == "mine" and ns[f"_{k}"] == 42 and ns["Out"][k] == 42


def test_cleanup_out_with_vars_naming_a_user_underscore_variable_deletes_only_it(loaded):
    ns = loaded.user_ns
    n = output_cell(loaded, "cuda.tensor(2**20)")
    run(loaded, f"_{n} = 'mine'; _ = ['my', 'list']")
    lst = ns["_"]
    magic(loaded, f"cleanup --out --vars _{n}")
    assert f"_{n}" not in ns and ns["_"] is lst


def test_cleanup_out_clears_the_names_the_cache_set(loaded, fake_gpu):
    ns = loaded.user_ns
    a = output_cell(loaded, "cuda.tensor(64 * 2**20)")
    b = output_cell(loaded, "cuda.tensor(64 * 2**20)")
    hidden = loaded.user_ns_hidden
    magic(loaded, "cleanup --out")
    assert f"_{a}" not in ns and f"_{b}" not in ns
    assert f"_{a}" not in hidden and f"_{b}" not in hidden
    assert (ns["_"], ns["__"], ns["___"]) == ("", "", "")
    assert fake_gpu.cuda.devices[0].allocated == 0


# -- --vars: only the user's names, validated first ----------------------------------------------
@pytest.mark.parametrize("name", ["_oh", "_ih", "_dh", "Out", "In", "get_ipython", "exit",
                                  "quit", "__builtins__", "_i", "_ii"])
def test_vars_refuses_ipythons_own_names_and_deletes_nothing(loaded, name):
    ns = loaded.user_ns
    run(loaded, "a = 1")
    before = dict(ns)
    with pytest.raises(UsageError, match=f"'{name}' is IPython's"):
        magic(loaded, f"cleanup --vars a,{name}")
    assert ns.keys() == before.keys() and all(ns[k] is v for k, v in before.items())
    k = output_cell(loaded, "6 * 7")  # the shell still works: Out, _oh, _N
    assert ns["Out"][k] == 42


def test_vars_refuses_an_output_cache_entry_and_points_at_out(loaded):
    n = output_cell(loaded, "cuda.tensor(2**20)")
    for name in (f"_{n}", "_"):
        with pytest.raises(UsageError, match=f"'{name}' is IPython's output cache.*--out"):
            magic(loaded, f"cleanup --vars {name}")
    assert loaded.user_ns[f"_{n}"] is loaded.user_ns["Out"][n]


def test_vars_refuses_a_name_ipython_put_in_its_hidden_namespace(loaded):
    loaded.push({"helper": object()}, interactive=False)  # as %pylab and extensions do
    with pytest.raises(UsageError, match="'helper' is IPython's"):
        magic(loaded, "cleanup --vars helper")
    run(loaded, "helper = 'mine now'")  # rebound by the user: theirs to delete
    magic(loaded, "cleanup --vars helper")
    assert "helper" not in loaded.user_ns


def test_vars_duplicates_are_harmless(loaded):
    run(loaded, "a = cuda.tensor(2**20); b = 2")
    report = magic(loaded, "cleanup --vars a,a -o")
    assert "a" not in loaded.user_ns and loaded.user_ns["b"] == 2
    assert step(report, "variables").did == "deleted a"


def test_an_unknown_name_among_known_ones_deletes_nothing(loaded):
    run(loaded, "a = 1; b = 2")
    with pytest.raises(UsageError, match="no variable named 'nope'"):
        magic(loaded, "cleanup --vars a,nope,b")
    assert (loaded.user_ns["a"], loaded.user_ns["b"]) == (1, 2)


# -- the default step: only the cell's stored exception, never the user's objects ----------------
RAISE_IN_F = "def f():\n    big = cuda.tensor(2**30)\n    raise ValueError('boom')\n"


def test_default_cleanup_leaves_a_generator_the_traceback_runs_through_working(loaded):
    run(loaded, "def gen():\n    err = None\n    while True:\n        x = yield err\n"
                "        try:\n            x()\n        except ZeroDivisionError as e:\n"
                "            err = e\n"
                "g = gen(); next(g)")
    run(loaded, "raise g.send(lambda: 1/0)")  # the traceback now runs through g's frame
    err = loaded.user_ns["g"].gi_frame.f_locals["err"]
    tb = err.__traceback__
    report = magic(loaded, "cleanup -o")
    g = loaded.user_ns["g"]
    assert g.send(lambda: None) is err  # still running, still holding its exception
    assert err.__traceback__ is tb and tb.tb_next is not None
    assert "held by" in step(report, "last exception").did


def test_default_cleanup_keeps_the_traceback_of_an_exception_the_user_saved(loaded, fake_gpu):
    run(loaded, RAISE_IN_F + "try:\n    f()\nexcept ValueError as e:\n    saved = e\n"
                "    raise RuntimeError('wrapped')")
    saved = loaded.user_ns["saved"]
    tb = saved.__traceback__
    links = []
    t = tb
    while t is not None:
        links.append((t, t.tb_frame, t.tb_next))
        t = t.tb_next
    report = magic(loaded, "cleanup -o")
    assert saved.__traceback__ is tb
    t = tb
    for link, frame, nxt in links:
        assert (t, t.tb_frame, t.tb_next) == (link, frame, nxt)
        t = t.tb_next
    assert "big" in links[-1][1].f_locals  # f's locals are still there for the user
    assert fake_gpu.cuda.devices[0].allocated == GiB  # kept: it is the user's data
    assert "held by your variable saved" in step(report, "last exception").did


def test_default_cleanup_frees_a_traceback_nothing_else_holds_and_says_which_cell(loaded,
                                                                                  fake_gpu):
    n = loaded.execution_count
    run(loaded, RAISE_IN_F + "f()")
    report = magic(loaded, "cleanup -o")
    last = step(report, "last exception")
    assert last.freed_allocated_bytes == GiB
    assert f"dropped the stored ValueError of cell [{n}]" in last.did
    assert not hasattr(sys, "last_value") and fake_gpu.cuda.devices[0].allocated == 0


def test_a_second_cleanup_does_not_report_a_drop_it_did_not_make(loaded):
    # Issue 11: "dropped the stored traceback (1 frames)" when nothing had raised since.
    run(loaded, RAISE_IN_F + "f()")
    magic(loaded, "cleanup")
    run(loaded, "x = 1")
    report = magic(loaded, "cleanup -o")
    assert step(report, "last exception").did == "no stored exception from a cell"


def test_debug_after_cleanup_says_there_is_no_traceback(loaded, caplog):
    run(loaded, RAISE_IN_F + "f()")
    magic(loaded, "cleanup")
    loaded.run_line_magic("debug", "")  # with sys.last_* set to None it raised AttributeError
    assert "No traceback has been produced" in caplog.text


# -- exceptions not raised by a cell -------------------------------------------------------------
def widget_handler_fails(ip: Any) -> BaseException:
    """What ipywidgets' CallbackDispatcher does when a handler raises between cells (plotly's
    trace-delta handler did, issue 7): ``showtraceback()`` stores it in ``sys.last_value``."""

    def _remove_overlapping_props(deltas: Any) -> None:
        raise ValueError("The truth value of an array with more than one element is ambiguous")

    try:
        _remove_overlapping_props(FakeTensor(256 * MiB))
    except ValueError:
        ip.showtraceback()
    return sys.last_value


def test_an_exception_from_a_widget_handler_is_neither_a_holder_nor_dropped(loaded, capsys):
    err = widget_handler_fails(loaded)
    holders = magic(loaded, "who -o").holders
    assert not [h for h in holders if h.kind == "traceback"], holders
    report = magic(loaded, "cleanup -o")
    assert sys.last_value is err and err.__traceback__ is not None
    did = step(report, "last exception").did
    assert did.startswith("no stored exception from a cell") and "not raised by a cell" in did


def test_a_cells_exception_stays_the_holder_after_a_widget_handler_fails(loaded, fake_gpu):
    n = loaded.execution_count
    run(loaded, RAISE_IN_F + "f()")
    widget_handler_fails(loaded)
    names = [h.name for h in magic(loaded, "who -o").holders if h.kind == "traceback"]
    assert names == ["traceback: f() locals"]
    report = magic(loaded, "cleanup -o")
    assert f"cell [{n}]" in step(report, "last exception").did
    assert fake_gpu.cuda.devices[0].allocated == 0


def test_the_monitor_does_not_keep_a_cells_exception_alive_once_the_shell_let_go(loaded):
    run(loaded, RAISE_IN_F + "f()")
    mon = current_monitor(loaded)
    assert mon.last_cell_exception.error is not None
    widget_handler_fails(loaded)
    run(loaded, "y = 1")  # the last result no longer holds it either
    assert mon.last_cell_exception.error is None


def test_an_exception_inside_a_gpumem_cell_magic_is_the_users(loaded, fake_gpu):
    run(loaded, "%%gpumem -q\n" + RAISE_IN_F + "f()")
    assert fake_gpu.cuda.devices[0].allocated == GiB
    magic(loaded, "cleanup")
    assert fake_gpu.cuda.devices[0].allocated == 0


def test_an_exception_from_before_the_extension_loaded_is_still_the_users(shell, fake_gpu):
    shell.user_ns["cuda"] = fake_gpu.cuda
    run(shell, RAISE_IN_F + "f()")
    run(shell, "%load_ext gpumem_nb")
    assert [h.name for h in magic(shell, "who -o").holders] == ["traceback: f() locals"]
    magic(shell, "cleanup")
    assert fake_gpu.cuda.devices[0].allocated == 0


# -- dry run -------------------------------------------------------------------------------------
def test_dry_run_names_what_it_would_keep_and_changes_nothing(loaded, fake_gpu):
    run(loaded, RAISE_IN_F + "try:\n    f()\nexcept ValueError as e:\n    saved = e\n    raise")
    n = output_cell(loaded, "cuda.tensor(2**20)")
    run(loaded, f"_{n} = 'mine'")
    value = sys.last_value
    report = magic(loaded, "cleanup --dry-run --out -o")
    assert sys.last_value is value and value.__traceback__ is not None
    assert loaded.user_ns[f"_{n}"] == "mine" and n in loaded.user_ns["Out"]
    assert "held by your variable saved" in step(report, "last exception").did
    assert step(report, "last exception").freed_allocated_bytes == 0
    assert f"would keep _{n} (yours)" in step(report, "output cache").did


def test_default_cleanup_frees_a_traceback_python_3_12_also_keeps_in_sys_last_exc(
        loaded, fake_gpu, monkeypatch):
    # The H200 host runs Python 3.12, where IPython also stores the exception in
    # sys.last_exc; emulated here on whatever Python runs the suite. The whole GPU test's
    # sequence: freed by default, kept while the user holds it, freed once they let go.
    real = loaded._get_exc_info

    def like_312(exc_tuple: Any = None) -> Any:
        etype, value, tb = real(exc_tuple)
        sys.last_exc = value
        return etype, value, tb

    monkeypatch.setattr(loaded, "_get_exc_info", like_312)
    alloc = lambda: fake_gpu.cuda.devices[0].allocated  # noqa: E731
    run(loaded, RAISE_IN_F + "f()")
    assert sys.last_exc is sys.last_value and alloc() == GiB
    report = magic(loaded, "cleanup -o")
    assert step(report, "last exception").freed_allocated_bytes == GiB and alloc() == 0
    assert not hasattr(sys, "last_exc")
    run(loaded, "try:\n    f()\nexcept ValueError as e:\n    saved = e\n    raise")
    report = magic(loaded, "cleanup -o")
    assert "held by your variable saved" in step(report, "last exception").did
    assert alloc() == GiB
    magic(loaded, "cleanup --vars saved")
    assert alloc() == 0


# -- each step credited with what it freed (issue 15) --------------------------------------------
def test_each_step_is_credited_with_what_it_alone_freed_and_the_rows_add_up(loaded, fake_gpu):
    import gc

    ip, cuda = loaded, fake_gpu.cuda
    gc.disable()  # so the garbage stays garbage until cleanup collects it
    try:
        # 1 GiB only a reference cycle keeps (garbage already), 2 GiB in a failed cell's
        # traceback, 4 GiB in Out.
        run(ip, "class Cycle:\n    pass\nc = Cycle(); c.me = c; c.t = cuda.tensor(2**30); del c")
        run(ip, "def f():\n    t = cuda.tensor(2 * 2**30)\n    raise ValueError('x')\nf()")
        output_cell(ip, "cuda.tensor(4 * 2**30)")
        assert cuda.devices[0].allocated == 7 * GiB
        report = magic(ip, "cleanup --out -o")
    finally:
        gc.enable()
    freed = {s.step: s.freed_allocated_bytes for s in report.steps}
    # Collected inside the first step, the cycle's 1 GiB was credited to the exception, and
    # the gc.collect row read 0 B in every notebook.
    assert freed["gc.collect"] == GiB
    assert freed["last exception"] == 2 * GiB
    assert freed["output cache"] == 4 * GiB
    rows = [s.freed_allocated_bytes or 0 for s in report.steps]
    assert sum(rows) == report.before.allocated_bytes - report.after.allocated_bytes == 7 * GiB
    assert report.steps[0].step == "gc.collect"


# -- a Ctrl-C part-way (reliability re-test 2026-12-05, G1) -------------------------------------
def _interrupt() -> None:
    raise KeyboardInterrupt


def test_a_ctrl_c_in_cleanups_last_step_reports_what_was_done_then_goes_on(
        loaded, fake_gpu, monkeypatch, capsys):
    # The cell showed only a KeyboardInterrupt traceback, after cleanup had deleted a1 and
    # a2, cleared Out, dropped the stored ValueError and freed their memory.
    run(loaded, "a1 = cuda.tensor(4 * 2**20); a2 = cuda.tensor(4 * 2**20)")
    output_cell(loaded, "cuda.tensor(4 * 2**20)")
    run(loaded, RAISE_IN_F + "f()")
    capsys.readouterr()
    monkeypatch.setattr(fake_gpu.cuda, "empty_cache", _interrupt)  # lands in the C call
    with pytest.raises(KeyboardInterrupt):
        magic(loaded, "cleanup --out --vars a1,a2")
    shown = capsys.readouterr().out
    assert "gpumem cleanup: interrupted (Ctrl-C) in its empty_cache step" in shown
    rows = {line.split()[0]: line for line in shown.splitlines()[3:]}
    assert "dropped the stored ValueError" in rows["last"] and "1.00 GiB" in rows["last"]
    assert "cleared 1 Out entries" in rows["output"] and "4.00 MiB" in rows["output"]
    assert "deleted a1, a2" in rows["variables"] and "8.00 MiB" in rows["variables"]
    assert "interrupted (Ctrl-C) while returning unused cached blocks" in rows["empty_cache"]
    assert "1.01 GiB" in rows["total"]  # so far: 1 GiB + 4 MiB + 8 MiB
    assert "a1" not in loaded.user_ns and loaded.user_ns["Out"] == {}


def test_a_ctrl_c_before_a_step_was_measured_still_reports_what_it_did(loaded, fake_gpu,
                                                                       monkeypatch, capsys):
    run(loaded, "a1 = cuda.tensor(4 * 2**20)")
    output_cell(loaded, "cuda.tensor(4 * 2**20)")
    mon = current_monitor(loaded)
    reads = []
    real = mon.read

    def read(**kw: Any) -> Any:  # before, after gc.collect, after the exception, after Out
        reads.append(1)
        if len(reads) == 4:
            raise KeyboardInterrupt  # a Ctrl-C pending at the reading after clearing Out
        return real(**kw)

    monkeypatch.setattr(mon, "read", read)
    with pytest.raises(KeyboardInterrupt):
        magic(loaded, "cleanup --out --vars a1")
    shown = capsys.readouterr().out
    assert "interrupted (Ctrl-C) in its output cache step" in shown
    assert "cleared 1 Out entries" in shown and "before it was measured" in shown
    assert "variables" not in shown and "a1" in loaded.user_ns  # never reached: kept


class _InterruptedAfterPop(dict):
    """A namespace where a Ctrl-C is delivered as ``pop`` returns, before cleanup could note
    the name it deleted."""

    def pop(self, key: Any, *default: Any) -> Any:
        super().pop(key, *default)
        raise KeyboardInterrupt


def test_a_ctrl_c_between_deleting_two_variables_never_loses_the_one_deleted():
    from types import SimpleNamespace

    from gpumem_nb import cleanup

    ns = _InterruptedAfterPop(a1=FakeTensor(MiB, "cuda:0"), a2=FakeTensor(MiB, "cuda:0"))
    shell = SimpleNamespace(user_ns=ns, user_ns_hidden={})
    got: list[Any] = []
    request = cleanup.CleanupRequest(clear_traceback=False, delete_vars=["a1", "a2"])
    with pytest.raises(KeyboardInterrupt):
        cleanup.run(request, shell=shell, measure=_no_gpu_reading, modules={},
                    on_interrupt=got.append)
    [report] = got
    assert report.interrupted == "in its variables step"
    assert report.steps[-1].did == ("deleted a1; kept a2; interrupted (Ctrl-C) before it "
                                    "was measured")
    assert "a1" not in ns and "a2" in ns


def _no_gpu_reading() -> Any:
    from gpumem_nb.model import Sample

    return Sample(t_s=0.0, wall_s=0.0, rss_bytes=None)


def test_a_stored_exception_search_cut_by_its_budget_says_not_checked_not_held(loaded, capsys,
                                                                                monkeypatch):
    # A newcomer's `1/0` on a loaded 2-core machine read "its frames stay alive, held by other
    # objects": the search had only run out of time, and found no keeper.
    import gpumem_nb.cleanup as cleanup

    monkeypatch.setattr(cleanup, "_HELD_BUDGET_S", 0.0)
    loaded.run_cell("1/0", store_history=True)
    capsys.readouterr()
    report = loaded.run_line_magic("gpumem", "cleanup --dry-run -o")
    text = str(report)
    assert "not checked whether anything else keeps its frames alive" in text
    assert "stay alive" not in text
    step = next(s for s in report.steps if s.step == "last exception")
    assert "budget ran out" in step.did
