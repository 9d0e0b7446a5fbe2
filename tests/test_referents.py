"""The holder search never runs a module's C traversal: on CPython 3.12 without its fix,
``gc.get_referents`` of the ``_asyncio`` module hands out dead ``FutureIter`` objects from its
free list, and dropping them corrupts it; the next ``gc.collect()`` spins forever or aborts
(python/cpython#122695). In a Jupyter kernel that was the ``%gpumem cleanup`` after tutorial
11's out-of-memory error, on the H100 and the H200."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import types
from typing import Any

import gpumem_nb.referents as referents_module
from gpumem_nb.referents import referents

# Awaited futures fill _asyncio's free list, then the whole heap is read the way the OOM
# explainer's heap pass and the retention search read it, then the list is used again and
# collected. On an affected interpreter, with gc.get_referents in place of referents, this
# aborts ("object already tracked") or never returns.
AFTER_AWAITS = textwrap.dedent("""
    import asyncio, gc, types
    from gpumem_nb.referents import referents
    from gpumem_nb.holders.heap import exported

    loop = asyncio.new_event_loop()
    async def waits():
        for _ in range(20):
            f = loop.create_future()
            loop.call_soon(f.set_result, None)
            await f
    loop.run_until_complete(waits())
    for _ in range(5):
        it = iter(loop.create_future()); del it
    exported(types.SimpleNamespace(info=lambda cap: None), set(), 30.0, 1000)
    refs = referents(*gc.get_objects()); refs.clear(); del refs
    for obj in gc.get_objects():
        if type(obj) is types.ModuleType:
            referents(obj)
    loop.run_until_complete(waits())
    gc.collect()
    print("collected")
""")


def test_a_heap_read_after_awaited_futures_leaves_the_next_collection_working():
    r = subprocess.run([sys.executable, "-c", AFTER_AWAITS], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "collected" in r.stdout, (r.returncode, r.stderr[-2000:])


def test_a_module_gives_its_namespace_and_its_c_traversal_never_runs(monkeypatch):
    asked: list[Any] = []
    real = gc.get_referents

    def recording(*objs: Any) -> list[Any]:
        asked.extend(objs)
        return real(*objs)

    monkeypatch.setattr(referents_module, "gc", types.SimpleNamespace(get_referents=recording))
    import _asyncio

    mod = types.ModuleType("m")
    mod.x = [1]  # type: ignore[attr-defined]
    out = referents(_asyncio, mod, mod.x)  # type: ignore[attr-defined]
    assert any(o is vars(_asyncio) for o in out) and any(o is vars(mod) for o in out)
    assert referents(_asyncio) == [vars(_asyncio)]
    assert not [o for o in asked if isinstance(o, types.ModuleType)], asked
    assert any(o is mod.x for o in asked)  # type: ignore[attr-defined]


def test_a_module_subclass_is_a_module_here_too():
    class Lazy(types.ModuleType):
        def __getattr__(self, name: str) -> Any:
            raise AssertionError("a module's __getattr__ ran")

    lazy = Lazy("lazy")
    assert referents(lazy) == [vars(types.ModuleType)["__dict__"].__get__(lazy)]
