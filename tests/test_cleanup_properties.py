"""Property: `%gpumem cleanup` never destroys or changes what the user did not name.

Hypothesis writes small notebooks: variables holding nested containers of (fake) CUDA tensors,
cells whose values land in the output cache, `_`/`__`/`___`/`_N` the user assigned, exceptions
raised, re-raised, wrapped or saved, live generators whose frames a traceback runs through,
frames the user kept, and a widget handler failing between cells. Each notebook runs in
IPython's real shell; then one cleanup runs with a drawn combination of flags.

After it, every name the user did not name is still bound to the same object in the same
observable state (container contents, tensor identity, an exception's traceback chain, a
frame's locals, a generator that still answers), and ``--dry-run`` or a refused name changes
nothing at all, not even IPython's own bookkeeping.

The oracle for "the user's" is the program itself, not the product's rules: a name the user
assigned is theirs; only `_`-names the output cache wrote may go with ``--out``.
"""

from __future__ import annotations

import gc
import inspect
import re
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from IPython.core.error import UsageError

from gpumem_nb.cellnames import is_cell_top
from gpumem_nb.kernel import current_monitor

from .fakes import FakeTensor

pytestmark = pytest.mark.slow  # hypothesis over cleanup's promise

MiB = 1 << 20
SETTINGS = settings(max_examples=150, deadline=None, derandomize=False,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])

PRELUDE = """
import sys as _sys_t
def raiser(n):
    big = cuda.tensor(n)
    raise ValueError('boom')
def make_gen():
    err = None
    while True:
        x = yield err
        try:
            x()
        except ZeroDivisionError as e:
            err = e
def frame_saver(box, n):
    big = cuda.tensor(n)
    box.append(_sys_t._getframe())
    raise KeyError('k')
"""
ALIAS = re.compile(r"^(_|__|___|_\d+)$")

# -- programs ------------------------------------------------------------------------------------
leaves = st.one_of(
    st.integers(-3, 3).map(str),
    st.sampled_from(["'s'", "None", "cuda.tensor(2**20)", "cuda.tensor(3 * 2**20)"]),
)
values = st.recursive(
    leaves,
    lambda kids: st.one_of(
        st.lists(kids, max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]"),
        st.lists(kids, max_size=3).map(lambda xs: "(" + "".join(x + ", " for x in xs) + ")"),
        st.dictionaries(st.sampled_from("abc"), kids, max_size=3).map(
            lambda d: "{" + ", ".join(f"{k!r}: {v}" for k, v in d.items()) + "}"),
    ),
    max_leaves=6,
)


@dataclass
class Step:
    kind: str  # assign, show, under, gen, raise, widget
    arg: Any = None
    expr: str = ""


@st.composite
def programs(draw: Any) -> list[Step]:
    steps: list[Step] = []
    names: list[str] = []
    gens: list[str] = []
    shows = 0
    raises = 0
    for i in range(draw(st.integers(1, 9))):
        kind = draw(st.sampled_from(["assign", "assign", "show", "show", "under", "gen",
                                     "raise", "raise", "widget"]))
        ref = st.sampled_from(names) if names else values
        if kind == "assign":
            steps.append(Step("assign", f"v{i}", draw(st.one_of(values, ref))))
            names.append(f"v{i}")
        elif kind == "show":
            steps.append(Step("show", None, draw(st.one_of(values, ref))))
            shows += 1
        elif kind == "under":
            which = draw(st.sampled_from(["_", "__", "___", *(f"#{k}" for k in range(shows))]))
            steps.append(Step("under", which, f"['mine', {i}, {draw(values)}]"))
        elif kind == "gen":
            steps.append(Step("gen", f"g{i}"))
            gens.append(f"g{i}")
            names.append(f"g{i}")
        elif kind == "raise":
            variant = draw(st.sampled_from(
                ["plain", "reraise", "wrap", "saved_only", "frame", *(["gen"] if gens else [])]))
            arg = draw(st.sampled_from(gens)) if variant == "gen" else f"{i}"
            steps.append(Step("raise", (variant, arg)))
            raises += 1
        else:
            steps.append(Step("widget"))
    return steps


@dataclass
class World:
    user_assigned: set[str] = field(default_factory=set)
    out_numbers: list[int] = field(default_factory=list)


def widget_handler_fails(ip: Any) -> None:
    def _remove_overlapping_props(deltas: Any) -> None:
        raise ValueError("ambiguous truth value")

    try:
        _remove_overlapping_props(FakeTensor(MiB))
    except ValueError:
        ip.showtraceback()


def execute(ip: Any, steps: list[Step]) -> World:
    world = World()

    def cell(src: str) -> None:
        ip.run_cell(src, store_history=True)

    for s in steps:
        if s.kind == "assign":
            cell(f"{s.arg} = {s.expr}")
            world.user_assigned.add(s.arg)
        elif s.kind == "show":
            n = ip.execution_count
            cell(s.expr)
            if n in ip.user_ns["Out"]:
                world.out_numbers.append(n)
        elif s.kind == "under":
            name = s.arg if not s.arg.startswith("#") else (
                f"_{world.out_numbers[int(s.arg[1:])]}"
                if int(s.arg[1:]) < len(world.out_numbers) else "_")
            cell(f"{name} = {s.expr}")
            world.user_assigned.add(name)
        elif s.kind == "gen":
            cell(f"{s.arg} = make_gen(); next({s.arg})")
            world.user_assigned.add(s.arg)
        elif s.kind == "raise":
            variant, arg = s.arg
            if variant == "plain":
                cell("raiser(2**20)")
            elif variant == "reraise":
                cell(f"try:\n    raiser(2**20)\nexcept ValueError as e:\n    saved{arg} = e\n"
                     "    raise")
                world.user_assigned.add(f"saved{arg}")
            elif variant == "wrap":
                cell(f"try:\n    raiser(2**20)\nexcept ValueError as e:\n    saved{arg} = e\n"
                     "    raise RuntimeError('wrapped')")
                world.user_assigned.add(f"saved{arg}")
            elif variant == "saved_only":
                cell(f"try:\n    raiser(2**20)\nexcept ValueError as e:\n    saved{arg} = e")
                world.user_assigned.add(f"saved{arg}")
            elif variant == "frame":
                cell(f"frames{arg} = []\nframe_saver(frames{arg}, 2**20)")
                world.user_assigned.add(f"frames{arg}")
            else:
                cell(f"raise {arg}.send(lambda: 1/0)")
        else:
            widget_handler_fails(ip)
    return world


# -- observing state -----------------------------------------------------------------------------
def fingerprint(obj: Any, depth: int = 0, seen: set[int] | None = None) -> Any:
    """A value that changes when anything a user could observe about ``obj`` changes."""
    seen = set() if seen is None else seen
    if depth > 8 or id(obj) in seen:
        return ("ref", id(obj))
    seen.add(id(obj))
    rec = lambda o: fingerprint(o, depth + 1, seen)  # noqa: E731
    if isinstance(obj, FakeTensor):
        return ("tensor", id(obj), obj._nbytes)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, getattr(torch, "Tensor", ())):
        return ("tensor", id(obj), obj.data_ptr(), obj.untyped_storage().nbytes())
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, id(obj), tuple(rec(x) for x in obj))
    if isinstance(obj, dict):
        return ("dict", id(obj), tuple((k, rec(v)) for k, v in obj.items()))
    if isinstance(obj, BaseException):
        return ("exc", id(obj), rec(obj.__traceback__), rec(obj.__context__),
                rec(obj.__cause__), obj.args)
    if isinstance(obj, types.TracebackType):
        links = []
        tb: types.TracebackType | None = obj
        while tb is not None:
            links.append((id(tb), tb.tb_lineno, rec(tb.tb_frame)))
            tb = tb.tb_next
        return ("tb", tuple(links))
    if isinstance(obj, types.FrameType):
        if is_cell_top(obj.f_code.co_name):  # "<cell line: 0>" on IPython 7
            return ("module frame", id(obj))
        return ("frame", id(obj), tuple((k, rec(v)) for k, v in sorted(obj.f_locals.items())))
    if isinstance(obj, types.GeneratorType):
        return ("gen", id(obj), inspect.getgeneratorstate(obj), rec(obj.gi_frame))
    return ("obj", id(obj), type(obj).__name__)


def bookkeeping(ip: Any) -> Any:
    """Everything of IPython's and the interpreter's that cleanup may touch."""
    result = ip.last_execution_result
    hook = ip.displayhook
    return (
        tuple((k, id(v)) for k, v in ip.user_ns.items()),
        tuple((k, id(v)) for k, v in ip.user_ns["Out"].items()),
        tuple((k, id(v)) for k, v in ip.user_ns_hidden.items()),
        tuple(id(getattr(sys, n, None)) for n in ("last_type", "last_value", "last_traceback")),
        id(result), id(getattr(result, "error_in_exec", None)), id(getattr(result, "result", 0)),
        id(getattr(ip.InteractiveTB, "tb", None)),
        id(hook._), id(hook.__), id(hook.___),
    )


def fresh(ip: Any) -> None:
    ip.run_cell("%reset -f", store_history=False)
    for name in ("last_exc", "last_type", "last_value", "last_traceback"):
        if hasattr(sys, name):
            delattr(sys, name)
    current_monitor(ip).last_cell_exception.release()
    ip.InteractiveTB.tb = None
    ip.run_cell(PRELUDE, store_history=True)


@pytest.fixture
def world_shell(shell: Any, fake_gpu: Any, capsys: Any) -> Any:
    """The shell, with the test process's own objects frozen out of the collector's way (a
    full collection over them costs ~100 ms, and cleanup collects several times), and short
    tracebacks (formatting a verbose one costs ~100 ms). What cleanup may touch is the same
    in every traceback mode: sys.last_*, the last result, the formatter's ``tb``.

    Frozen objects (the shell's namespace among them) are invisible to
    ``gc.get_referrers``, so the report's "held by your variable" wording is not checked
    here; test_cleanup.py checks it. What cleanup changes never depends on that search."""
    shell.run_cell("%load_ext gpumem_nb", store_history=True)
    shell.user_ns["cuda"] = fake_gpu.cuda
    mode = shell.InteractiveTB.mode
    shell.run_line_magic("xmode", "Minimal")
    gc.collect()
    gc.freeze()
    capsys.readouterr()
    yield shell
    gc.unfreeze()
    shell.run_line_magic("xmode", mode)


def prepare(ip: Any, cuda: Any, steps: list[Step]) -> World:
    """A fresh namespace, ``cuda.tensor(nbytes)`` for the program, then the program."""
    fresh(ip)
    ip.user_ns["cuda"] = cuda
    return execute(ip, steps)


flags = st.fixed_dictionaries({
    "dry_run": st.booleans(),
    "out": st.booleans(),
    "keep_traceback": st.booleans(),
})


def command(f: dict[str, bool], names: list[str]) -> str:
    parts = ["cleanup -o"]
    if f["dry_run"]:
        parts.append("--dry-run")
    if f["out"]:
        parts.append("--out")
    if f["keep_traceback"]:
        parts.append("--keep-traceback")
    if names:
        parts.append("--vars " + ",".join(names))
    return " ".join(parts)


# -- the properties --------------------------------------------------------------------------
def check_cleanup(ip: Any, world: World, f: dict[str, bool], named: list[str],
                  allocated: Callable[[], int], empty_cache_calls: Callable[[], int]) -> None:
    """Run one cleanup and check that nothing the user did not name changed."""
    ns = ip.user_ns
    # Everything not named, except `_`-names the cache wrote when --out clears the cache.
    keep = [k for k in ns if isinstance(k, str) and k not in named
            and not (f["out"] and ALIAS.match(k) and k not in world.user_assigned)]
    before = {k: fingerprint(ns[k]) for k in keep}
    gens = {k: ns[k] for k in keep if isinstance(ns[k], types.GeneratorType)
            and inspect.getgeneratorstate(ns[k]) == "GEN_SUSPENDED"}
    answers = {k: g.gi_frame.f_locals["err"] for k, g in gens.items()}
    out_dict = ns["Out"]
    gc.collect()  # cleanup collects garbage first; only what is reachable must stay put
    book = bookkeeping(ip)
    held = allocated()
    calls = empty_cache_calls()

    ip.run_line_magic("gpumem", command(f, named))

    if f["out"]:  # what --out names: the Out dict's entries (the dict itself stays)
        keep = [k for k in keep if k not in ("Out", "_oh")]
        assert ns["Out"] is out_dict and ns["_oh"] is out_dict
        assert out_dict == {} or f["dry_run"]
    for k in keep:
        assert k in ns, f"{k} was removed"
        assert fingerprint(ns[k]) == before[k], f"{k} changed"
    for k in named:
        assert (k in ns) == f["dry_run"], k
    if f["dry_run"]:
        assert bookkeeping(ip) == book
        assert allocated() == held
        assert empty_cache_calls() == calls
    for k, g in gens.items():  # every live generator still runs and answers as before
        assert g.send(lambda: None) is answers[k], k


def draw_names(data: Any, world: World, ns: dict[str, Any]) -> list[str]:
    deletable = sorted(n for n in world.user_assigned if n in ns)
    return data.draw(st.lists(st.sampled_from(deletable), max_size=3, unique=True)
                     if deletable else st.just([]))


@SETTINGS
@given(steps=programs(), f=flags, data=st.data())
def test_cleanup_changes_nothing_the_user_did_not_name(world_shell, fake_gpu, steps, f, data):
    cuda = fake_gpu.cuda
    world = prepare(world_shell, cuda, steps)
    check_cleanup(world_shell, world, f, draw_names(data, world, world_shell.user_ns),
                  allocated=lambda: cuda.devices[0].allocated,
                  empty_cache_calls=lambda: cuda.calls.count("empty_cache"))


@SETTINGS
@given(steps=programs(), f=flags, data=st.data())
def test_a_refused_or_unknown_name_changes_nothing_at_all(world_shell, fake_gpu, steps, f,
                                                          data):
    ip = world_shell
    world = prepare(ip, fake_gpu.cuda, steps)
    ns = ip.user_ns
    good = sorted(n for n in world.user_assigned if n in ns)
    bad = data.draw(st.sampled_from(["_oh", "Out", "In", "get_ipython", "_ih", "_i",
                                     "no_such_name", "exit"]))
    named = [*data.draw(st.lists(st.sampled_from(good), max_size=2, unique=True)
                        if good else st.just([])), bad]
    if f["out"]:  # one of the cache's own entries, if any: refused too
        cached = [k for k in ns if isinstance(k, str) and ALIAS.match(k)
                  and k not in world.user_assigned and ns[k] != ""]
        named += cached[:1]
    before = {k: fingerprint(v) for k, v in ns.items() if isinstance(k, str)}
    book = bookkeeping(ip)
    with pytest.raises(UsageError):
        ip.run_line_magic("gpumem", command(f, named))
    assert bookkeeping(ip) == book
    assert {k: fingerprint(v) for k, v in ns.items() if isinstance(k, str)} == before
