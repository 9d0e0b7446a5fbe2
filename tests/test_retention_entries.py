"""Where a root has no line of its own (a library's registry, the shell, a hook the interpreter
keeps), the advice removes the entry the retention path enters, and running that line frees
the bytes (issue 34: 9 of KINDS9's 14 kinds named their holder with no runnable line)."""

from __future__ import annotations

import gc
import sys
import types
import weakref
from typing import Any

import pytest

from gpumem_nb.holders.named import cut_code
from gpumem_nb.holders.retention import STATE_ROOTED, RootContext, Search

from .fakes import FakeTensor, GiB
from .test_oom import last, run
from .test_retention import fake_storage, oomworld  # noqa: F401 (a fixture)


def _kept_by_closure(nbytes: int) -> tuple[Any, Any]:
    """A function whose closure keeps one tensor, and a weak reference to that tensor."""
    live = [FakeTensor(nbytes)]

    def census(*args: Any) -> None:
        live.append(None) if args == ("never",) else None

    return census, weakref.ref(live[0])


def _installed(name: str) -> Any:
    """A module as an installed library's: its file under site-packages."""
    module = types.ModuleType(name)
    module.__file__ = f"/opt/venv/lib/python3.11/site-packages/{name}/__init__.py"
    return module


def _roots_line(ns: dict[str, Any], tensor: Any, **ctx: Any) -> str:
    out = Search(fake_storage, RootContext(user_ns=ns, **ctx)).run([tensor])
    (r,) = out.retained
    assert r.state == STATE_ROOTED, r
    return cut_code(r.roots)


def test_a_gc_callback_that_keeps_tensors_is_removed_from_gc_callbacks_and_that_frees_them():
    census, alive = _kept_by_closure(3 * GiB)
    gc.callbacks.append(census)
    ns: dict[str, Any] = {"census": census}
    del census
    try:
        line = _roots_line(ns, alive())
        assert line == ("import gc; gc.callbacks[:] = [x for x in gc.callbacks if x is not "
                        "census]; del census"), line
        exec(line, ns)
        gc.collect()
        assert alive() is None, "the advised line left the tensor alive"
    finally:
        gc.callbacks[:] = [c for c in gc.callbacks if c is not ns.get("census")]


def test_two_entries_of_one_public_registry_go_by_identity_and_nothing_else_goes():
    """An index line shifts: run after another line (or anyone) removed an entry before it,
    `del hooks[2]` took a bystander (a review, s02)."""
    census_a, alive = _kept_by_closure(2 * GiB)
    tensor = alive()
    census_b = types.FunctionType(census_a.__code__, {}, "census_b", None,
                                  census_a.__closure__)
    reglib = _installed("reglib")
    bystander = object()
    reglib.hooks = [census_a, bystander, census_b, census_a]  # type: ignore[attr-defined]
    ids = tuple(sorted((id(census_a), id(census_b))))
    sys.modules["reglib"] = reglib
    del census_a, census_b
    try:
        line = _roots_line({}, tensor)
        del tensor
        assert line == (f"import reglib; reglib.hooks[:] = [x for x in reglib.hooks if id(x) "
                        f"not in {ids}]"), line
        reglib.hooks.insert(0, "moved")  # type: ignore[attr-defined]
        exec(line, {})
        gc.collect()
        assert alive() is None
        assert reglib.hooks == ["moved", bystander]  # type: ignore[attr-defined]
    finally:
        del sys.modules["reglib"]


def test_a_replaced_interpreter_hook_is_put_back_from_its_dunder_original():
    """KINDS10 keeps errors in ``sys.unraisablehook``; the library keeps its original as
    ``sys.__unraisablehook__``, and putting it back is the line, not "drop that reference"."""
    hook, alive = _kept_by_closure(3 * GiB)
    sys.unraisablehook = hook
    del hook
    try:
        line = _roots_line({}, alive())
        assert line == "import sys; sys.unraisablehook = sys.__unraisablehook__", line
        exec(line, {})
        gc.collect()
        assert alive() is None
    finally:
        sys.unraisablehook = sys.__unraisablehook__


def test_a_list_of_tensors_an_entry_keeps_is_emptied_once_not_an_entry_per_tensor():
    """A logging filter that keeps records (KINDS10): three tensors in the list of an object
    a public registry holds are one holder with one line, and the registry keeps the
    object."""

    class Keep:
        def __init__(self) -> None:
            self.records = [FakeTensor(GiB + i) for i in range(3)]

    reglib = _installed("reglib3")
    keep = Keep()
    reglib.filters = [keep]  # type: ignore[attr-defined]
    sys.modules["reglib3"] = reglib
    alive = [weakref.ref(t) for t in keep.records]
    try:
        out = Search(fake_storage, RootContext(user_ns={})).run(list(keep.records))
        del keep
        lines = {cut_code(r.roots) for r in out.retained}
        assert lines == {"import reglib3; reglib3.filters[0].records.clear()"}, lines
        assert len({r.roots for r in out.retained}) == 1
        exec(lines.pop(), {})
        assert all(a() is None for a in alive)
        assert len(reglib.filters) == 1  # type: ignore[attr-defined]
    finally:
        del sys.modules["reglib3"]


def test_a_list_with_a_bystander_is_filtered_not_emptied():
    """`records.clear()` dropped a string and a function the list also held (review, s05d)."""

    class Keep:
        def __init__(self) -> None:
            self.records = [FakeTensor(GiB), "config", print]

    reglib = _installed("reglib4")
    reglib.filters = [Keep()]  # type: ignore[attr-defined]
    sys.modules["reglib4"] = reglib
    alive = weakref.ref(reglib.filters[0].records[0])  # type: ignore[attr-defined]
    try:
        line = _roots_line({}, alive())
        assert ".clear()" not in line, line
        exec(line, {})
        assert alive() is None
        assert reglib.filters[0].records == ["config", print]  # type: ignore[attr-defined]
    finally:
        del sys.modules["reglib4"]


def test_a_name_that_reached_the_bytes_only_through_the_removed_entry_is_not_deleted():
    """Every logger reaches every other through the logging manager's registry: a notebook's
    `logger` was told to go with the entry that held the bytes (review, s10)."""

    class Manager:
        def __init__(self, registry: dict[str, Any]) -> None:
            self.registry = registry

    class Holder:
        def __init__(self) -> None:
            self.buffer = [FakeTensor(GiB)]

    reglib = _installed("reglib5")
    reglib.registry = {"a": Holder(), "b": object()}  # type: ignore[attr-defined]
    sys.modules["reglib5"] = reglib
    ns = {"mgr": Manager(reglib.registry)}  # type: ignore[attr-defined]
    alive = weakref.ref(reglib.registry["a"].buffer[0])  # type: ignore[attr-defined]
    try:
        line = _roots_line(ns, alive())
        assert "mgr" not in line, line
        exec(line, {})
        assert alive() is None and "mgr" in ns
    finally:
        del sys.modules["reglib5"]


def test_a_private_library_registry_still_gets_no_line():
    census, alive = _kept_by_closure(GiB)
    reglib = _installed("reglib2")
    reglib._hooks = [census]  # type: ignore[attr-defined]
    sys.modules["reglib2"] = reglib
    del census
    try:
        assert _roots_line({}, alive()) == ""
    finally:
        del sys.modules["reglib2"]


def test_a_value_pushed_into_the_shells_hidden_namespace_is_deleted_there(shell):
    """KINDS9 startup_push_hidden_names: `get_ipython().user_ns_hidden['vocab_table']` was
    named with "drop that reference" and no line."""
    t = FakeTensor(3 * GiB)
    alive = weakref.ref(t)
    shell.push({"vocab_table": [t]}, interactive=False)
    del shell.user_ns["vocab_table"], t
    try:
        line = _roots_line(shell.user_ns, alive(), shell=shell)
        assert line.startswith("get_ipython().user_ns_hidden['vocab_table'][:] = "), line
        shell.run_cell(line, store_history=False)
        gc.collect()
        assert alive() is None
    finally:
        shell.user_ns_hidden.pop("vocab_table", None)


@pytest.mark.parametrize("oomworld", ["native"], indirect=True)
def test_an_oom_held_by_a_gc_callback_advises_a_line_that_frees_it(oomworld):  # noqa: F811
    """The whole chain, at the failure: the explanation's line for a gc callback's closure is
    run as a user would, and the allocator's bytes go."""
    shell = oomworld.shell
    try:
        run(shell, "import gc\n"
                   "def make():\n"
                   "    live = [cuda.tensor(40 * GiB)]\n"
                   "    def census(phase, info):\n"
                   "        return len(live)\n"
                   "    return census\n"
                   "gc.callbacks.append(make())")
        run(shell, "y = cuda.tensor(100 * GiB)")
        e = last(shell)
        (step,) = [a for a in e.actions if a.code and "gc.callbacks" in a.code]
        assert step.nbytes == 40 * GiB, str(e)
        before = oomworld.cuda.devices[0].allocated
        run(shell, step.code)
        assert before - oomworld.cuda.devices[0].allocated >= 0.95 * step.nbytes, str(e)
    finally:
        gc.callbacks[:] = [c for c in gc.callbacks
                           if getattr(c, "__qualname__", "") != "make.<locals>.census"]


@pytest.mark.parametrize("oomworld", ["native"], indirect=True)
def test_errors_a_replaced_thread_excepthook_keeps_are_freed_by_its_line_with_a_collection(
        oomworld):  # noqa: F811
    """KINDS10 on the H100: `del thread_error_hook; threading.excepthook =
    threading.__excepthook__` freed 0 of 28.50 GiB. Each thread made while the hook was set
    keeps it (threading's `_invoke_excepthook` closure), and the kept error's traceback keeps
    that thread's frame: cycles, which only a collection frees once the names go."""
    shell = oomworld.shell
    import threading

    try:
        run(shell, "import threading\n"
                   "def make_error_collector():\n"
                   "    errors = []\n"
                   "    def collect(args):\n"
                   "        errors.append(args.exc_value)\n"
                   "    return collect\n"
                   "thread_error_hook = make_error_collector()\n"
                   "threading.excepthook = thread_error_hook\n"
                   "def load_shard(nbytes):\n"
                   "    shard = cuda.tensor(nbytes)\n"
                   "    raise OSError('shard checksum mismatch')\n"
                   "for i in range(3):\n"
                   "    loader = threading.Thread(target=load_shard, args=(20 * GiB,))\n"
                   "    loader.start()\n"
                   "    loader.join()\n"
                   "del loader")
        run(shell, "y = cuda.tensor(100 * GiB)")
        e = last(shell)
        (step,) = [a for a in e.actions if a.code and "threading.excepthook" in a.code]
        assert step.nbytes == 60 * GiB, str(e)
        before = oomworld.cuda.devices[0].allocated
        run(shell, step.code)
        assert before - oomworld.cuda.devices[0].allocated >= 0.95 * step.nbytes, str(e)
    finally:
        threading.excepthook = threading.__excepthook__


def test_a_module_installed_outside_site_packages_is_a_library_not_the_users(tmp_path,
                                                                           monkeypatch):
    """On the H100, wheels installed with `pip install --target` were taken for the user's
    modules: the advice set `comm._comm_manager = None`. A folder with a `.dist-info` is an
    install; a folder of the user's own scripts is not."""
    from gpumem_nb.holders import roots

    installed, mine = tmp_path / "wheels", tmp_path / "project"
    (installed / "regpkg").mkdir(parents=True)
    (installed / "regpkg-1.0.dist-info").mkdir()
    (mine / "helper").mkdir(parents=True)
    monkeypatch.setattr(sys, "path", [str(installed), str(mine), *sys.path])
    monkeypatch.setattr(roots, "_INSTALL_FOLDERS", {})
    lib = types.ModuleType("regpkg")
    lib.__file__ = str(installed / "regpkg" / "__init__.py")
    user = types.ModuleType("helper")
    user.__file__ = str(mine / "helper" / "__init__.py")
    assert roots._library_module("regpkg", lib)
    assert not roots._library_module("helper", user)


def test_errors_a_custom_exception_handler_keeps_are_found_through_the_shell_not_unseen(
        oomworld):  # noqa: F811
    """KINDS10 on the H100: a `set_custom_exc` handler that keeps each error was 99.9% "not
    found". IPython keeps it as `types.MethodType(wrapped, shell)`, and the method's edge to
    its function was not an edge of the search: the function looked held from where Python
    cannot see."""
    shell = oomworld.shell
    try:
        run(shell, "def make_failure_keeper():\n"
                   "    kept = []\n"
                   "    def keep_failure(shell, etype, value, tb, tb_offset=None):\n"
                   "        kept.append(value)\n"
                   "        return [f'{etype.__name__}: {value}']\n"
                   "    keep_failure.kept = kept\n"
                   "    return keep_failure\n"
                   "get_ipython().set_custom_exc((ValueError,), make_failure_keeper())\n"
                   "def validate(nbytes):\n"
                   "    batch = cuda.tensor(nbytes)\n"
                   "    raise ValueError('labels out of range')")
        run(shell, "for i in range(2):\n"
                   "    get_ipython().run_cell('validate(20 * GiB)', store_history=False)\n"
                   "del i")
        run(shell, "y = cuda.tensor(130 * GiB)")
        e = last(shell)
        (h,) = [h for h in e.holders if h.nbytes >= 40 * GiB]
        assert h.kind == "the shell" and h.name.startswith("get_ipython().CustomTB"), str(e)
        assert "cannot see" not in str(e)
    finally:
        shell.set_custom_exc((), None)


def test_what_a_partials_own_attributes_keep_is_named_through_it_not_unseen(oomworld):  # noqa: F811
    """An edge the typed reading of a referrer does not name is still an edge: a
    `functools.partial` was read as its function, arguments and keywords, so a list in its
    own `__dict__` (a hook that keeps what it saw) looked held from where Python cannot see.
    The collector's traversal, read after the typed edges, names it."""
    shell = oomworld.shell
    try:
        run(shell, "import functools, sys, types\n"
                   "helpers = types.ModuleType('gm_hooks')\n"
                   "sys.modules['gm_hooks'] = helpers\n"
                   "helpers.on_batch = functools.partial(print, end='')\n"
                   "helpers.on_batch.seen = [cuda.tensor(30 * GiB), cuda.tensor(30 * GiB)]\n"
                   "del helpers")
        run(shell, "y = cuda.tensor(100 * GiB)")
        e = last(shell)
        (h,) = [h for h in e.holders if h.nbytes >= 50 * GiB]
        assert h.name.startswith("gm_hooks.on_batch"), str(e)
        assert "cannot see" not in str(e)
    finally:
        sys.modules.pop("gm_hooks", None)


def test_grad_fn_nodes_kept_in_a_list_get_a_del_line_that_frees_what_their_graphs_saved(
        oomworld):  # noqa: F811
    """KINDS10 on the H100: `graph_roots.append(loss.grad_fn)` after `del x, h, loss`. The
    advice told to store `loss.item()` or `.detach()` instead of tensors, with no line: there
    is no tensor in the list, and only deleting the nodes frees their saved tensors."""
    shell = oomworld.shell
    run(shell, "from tests.fakes import node\n"
               "def step():\n"
               "    return node('MeanBackward0', node('TanhBackward0', "
               "result=cuda.tensor(30 * GiB)))\n"
               "graph_roots = [step(), step()]")
    run(shell, "y = cuda.tensor(100 * GiB)")
    e = last(shell)
    (h,) = [h for h in e.holders if h.name == "graph_roots"]
    assert (h.nbytes, h.graph_bytes, h.nodes) == (0, 60 * GiB, 2), str(e)
    (step,) = [a for a in e.actions if a.code == "del graph_roots"]
    assert step.nbytes == 60 * GiB and "2 autograd nodes" in step.text, str(e)
    before = oomworld.cuda.devices[0].allocated
    run(shell, step.code)
    assert before - oomworld.cuda.devices[0].allocated == 60 * GiB


def test_one_autograd_node_kept_by_two_lists_needs_both_deleted(oomworld):  # noqa: F811
    """A reliability attack: `r1 = [g]; r2 = [g]` advised `del r1`, claimed 30 GiB, freed 0:
    the second holder reached the node the first had taken, and found no tensor under it to
    make it one more reference."""
    shell = oomworld.shell
    run(shell, "from tests.fakes import node\n"
               "g = node('MeanBackward0', node('TanhBackward0', result=cuda.tensor(30 * GiB)))\n"
               "r1 = [g]\n"
               "r2 = [g]\n"
               "del g")
    run(shell, "y = cuda.tensor(120 * GiB)")
    (a,) = [a for a in last(shell).actions if a.code.startswith("del r")]
    assert a.code == "del r1, r2"
    before = oomworld.cuda.devices[0].allocated
    run(shell, a.code)
    assert before - oomworld.cuda.devices[0].allocated == a.nbytes == 30 * GiB
