"""The advice's cut, run dry on the retention graph before it is given: whatever line a holder's
advice derives (a suspended generator's, a tensor with a graph's, a plain variable's), the bytes
it says it frees are those that become unreachable once it runs. On the H100, KINDS7: `del
reader` freed 0 (a generator in a cycle with its instance: the check said a collection was
needed, and the generator's own advice ignored it), and `del tap, model` freed 0 of 36 GiB
(autograd's C++ hook stack held the tap's bound methods, which the check saw as unexplained
references and left the advice as the walk gave it)."""

from __future__ import annotations

import ctypes
import gc
from typing import Any

import pytest

from gpumem_nb.analysis import holder_advice
from gpumem_nb.model import Holder

from .fakes import GiB
from .test_oom import last, run
from .test_retention import _held_action, oomworld  # noqa: F401  (the fixture)


def test_a_generator_in_a_cycle_with_its_instance_is_advised_a_collection_after_its_del(
        oomworld):  # noqa: F811
    shell = oomworld.shell
    gc.disable()
    try:
        run(shell, "class ShardReader:\n"
                   "    def __init__(self):\n"
                   "        self._batches = self._read()\n"
                   "        self.first = next(self._batches)\n"
                   "    def _read(self):\n"
                   "        while True:\n"
                   "            batch = cuda.tensor(60 * GiB)\n"
                   "            yield 1\n"
                   "reader = ShardReader()")
        run(shell, "y = cuda.tensor(100 * GiB)")
        e = last(shell)
        step = _held_action(e, "reader")
        assert step.code == "del reader; import gc; gc.collect()", str(e)
        before = oomworld.cuda.devices[0].allocated
        run(shell, step.code)
        assert before - oomworld.cuda.devices[0].allocated >= 0.95 * step.nbytes > 0
    finally:
        gc.enable()


def test_what_c_code_keeps_through_a_bound_method_is_never_advised_as_freed_by_del(
        oomworld):  # noqa: F811
    """A hook C code keeps (here an extra reference as a C extension takes one; torch's
    saved-tensor hooks in the H100's case) on a method of the holder: no `del` frees it, and
    the advice says so, naming the object C code holds."""
    shell = oomworld.shell
    run(shell, "class ActivationTap:\n"
               "    def __init__(self):\n"
               "        self.saved = [cuda.tensor(60 * GiB)]\n"
               "        self._hooks = (self._pack,)\n"
               "    def _pack(self, t):\n"
               "        self.saved.append(t)\n"
               "        return t\n"
               "tap = ActivationTap()")
    hook = shell.user_ns["tap"]._hooks[0]
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(hook))
    try:
        run(shell, "y = cuda.tensor(100 * GiB)")
        e = last(shell)
        (a,) = [a for a in e.actions if "tap" in a.text]
        assert not a.code.startswith("del "), a.text
        assert "(the method ActivationTap._pack).__self__.saved" in a.text and \
            "cannot see" in a.text, a.text
        before = oomworld.cuda.devices[0].allocated
        run(shell, "del tap; import gc; gc.collect()")
        assert oomworld.cuda.devices[0].allocated == before  # indeed, nothing was freed
    finally:
        ctypes.pythonapi.Py_DecRef(ctypes.py_object(hook))
        del hook
        gc.collect()


def test_a_checked_cut_that_frees_part_says_only_the_part_it_frees():
    h = Holder(name="cache", kind="container", device="cuda:0", nbytes=40 * GiB,
               code="del cache", cut_checked=True, cut_freed_bytes=10 * GiB,
               cut_note="thread 't': f() local x also keeps them")
    a = holder_advice(h)
    assert (a.code, a.nbytes) == ("del cache", 10 * GiB), a
    assert "10.00 GiB" in a.text and "thread 't'" in a.text, a.text


def test_every_del_line_the_walk_derives_gives_way_to_the_checked_cut():
    """A suspended generator's advice made its own `del` line, and the check's was lost."""
    h = Holder(name="reader", kind="variable", device="cuda:0", nbytes=6 * GiB,
               path=" → _batches suspended _read() locals (ShardReader)",
               code="del reader; import gc; gc.collect()", cut_checked=True)
    assert holder_advice(h).code == "del reader; import gc; gc.collect()"
    h = Holder(name="tap", kind="variable", device="cuda:0", nbytes=6 * GiB,
               holds_graph=True, graph_bytes=0, code="", cut_checked=False,
               cut_note="(the method T._pack).__self__.saved[0] is also held from where "
                        "Python cannot see")
    a = holder_advice(h)
    assert not a.code and "cannot see" in a.text, a


def test_a_del_line_whose_check_ran_out_claims_no_bytes_and_says_it_was_not_checked():
    """On the H100 the check's budget ran out for `del flush_loop` (an event loop's scheduled
    callbacks, also held in the loop's own cycles): the line still claimed 35 GiB, and freed
    0."""
    h = Holder(name="flush_loop", kind="variable", device="cuda:0", nbytes=35 * GiB,
               cut_note="not checked: the search's 0.3 s budget ran out")
    a = holder_advice(h)
    assert (a.code, a.nbytes) == ("del flush_loop", None), a
    assert "not checked: the search's 0.3 s budget ran out" in a.text, a.text


def test_what_only_the_cut_names_hold_sends_the_dry_run_through_no_untracked_container_pass():
    """The names a cut deletes were taken for objects nothing tracked refers to, and each
    check read the whole heap for untracked containers: on a 300,000-object CPU process that
    pass alone spent the check's 0.3 s, and `del copy_memo, teacher` and `del pipeline` went
    out unchecked (they freed 50% and 67% on the H100)."""
    from gpumem_nb.holders.retention import RootContext, Search

    from .fakes import FakeTensor
    from .test_retention import fake_storage

    ns: dict[str, Any] = {"pipeline": [FakeTensor(GiB)]}
    t = ns["pipeline"][0]
    search = Search(fake_storage, RootContext(user_ns={}), budget_s=30.0)
    out = search.run([t], ignore={id(ns)}, explained=[ns])
    del t
    assert [r.state for r in out.retained] == ["freed"], out
    assert search._untracked_cache is None  # the heap was never read for untracked containers


def test_a_memo_two_copies_share_is_cut_with_every_reference_in_one_del(oomworld):  # noqa: F811
    """H100, deepcopy_shared_memo_keeps_originals: `del copy_memo, teacher` freed 50%; the
    copied optimizer also kept the teacher's parameters."""
    shell = oomworld.shell
    run(shell, "class Opt:\n"
               "    def __init__(self, params):\n"
               "        self.param_groups = [{'params': list(params)}]\n"
               "copy_memo = {}\n"
               "student = [cuda.tensor(20 * GiB), cuda.tensor(20 * GiB)]\n"
               "teacher = [cuda.tensor(20 * GiB), cuda.tensor(20 * GiB)]\n"
               "copy_memo.update({1: teacher[0], 2: teacher[1], 3: list(student)})\n"
               "teacher_opt = Opt(teacher)\n"
               "del student")
    run(shell, "y = cuda.tensor(100 * GiB)")
    e = last(shell)
    step = _held_action(e, "copy_memo")
    assert step.code.startswith("del ") and "; del" not in step.code, str(e)
    assert set(step.code[4:].split(", ")) == {"copy_memo", "teacher", "teacher_opt"}, str(e)
    before = oomworld.cuda.devices[0].allocated
    run(shell, step.code)
    assert before - oomworld.cuda.devices[0].allocated >= 0.95 * step.nbytes > 0


@pytest.mark.slow  # a whole-heap retention search, 4-31 s on the 2-core machine
def test_a_cut_that_a_live_thread_shares_in_part_says_only_the_bytes_it_frees():
    """Storage by storage: the bytes a thread's local also keeps stay after the `del`; the
    rest is what the line frees, and it says only that."""
    import threading

    from gpumem_nb.holders import Scanner
    from gpumem_nb.holders.retention import RootContext
    from gpumem_nb.holders.threads import thread_locals
    from gpumem_nb.holders.verify import check_cuts, checked

    from .fakes import FakeTensor, fake_torch

    stop, ready = threading.Event(), threading.Event()
    shared = FakeTensor(5 * GiB)
    ns: dict[str, Any] = {"cache": [shared, FakeTensor(7 * GiB)]}

    def worker(batch: Any) -> None:
        ready.set()
        stop.wait(30)

    th = threading.Thread(target=worker, args=(shared,), name="loader", daemon=True)
    th.start()
    del shared
    assert ready.wait(10)
    try:
        tensors = list(ns["cache"])
        check = check_cuts({"cache": tensors}, {"cache": ["cache"]},
                           RootContext(user_ns=ns, thread_locals=thread_locals()),
                           Scanner({"torch": fake_torch()})._tensor_info,
                           budget_s=30.0)["cache"]
        tensors.clear()
        assert (check.freed_bytes, check.kept_bytes) == (7 * GiB, 5 * GiB), check
        h = checked(Holder(name="cache", kind="container", device="cuda:0",
                           nbytes=12 * GiB), check, "del cache")
        a = holder_advice(h)
        assert (a.code, a.nbytes) == ("del cache", 7 * GiB), a
        assert "thread 'loader'" in a.text, a.text
    finally:
        stop.set()
        th.join(10)
