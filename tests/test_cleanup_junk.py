"""Junk values must not break `who`, `cleanup` or re-run detection (issue 8).

The user's namespace can hold anything: objects whose attributes raise, proxies, containers
that lie about themselves, cycles, huge lists. Looking at them is the extension's job; failing
because of them is not. Each junk class below is one hostile shape.
"""

from __future__ import annotations

import gc
import itertools
import time
import weakref
from typing import Any

import pytest

from gpumem_nb.holders import Scanner
from gpumem_nb.kernel import current_monitor

from .fakes import FakeTensor, GiB, MiB, fake_torch
from .helpers import hang_guard


class ShapeRaises:
    """Looks like an array (``nbytes``, ``dtype``) but its ``shape`` raises: the object that
    made `%gpumem who` raise and stopped detection for good."""

    nbytes = 8
    dtype = "float32"

    @property
    def shape(self) -> Any:
        raise RuntimeError("shape is not available")


class GetattrRaises:
    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"no {name} for you")


class GetattributeRaises:
    def __getattribute__(self, name: str) -> Any:
        raise ValueError(name)


class ClassRaises:
    """A proxy whose ``__class__`` raises: ``isinstance`` looks it up."""

    @property  # type: ignore[misc]
    def __class__(self) -> Any:
        raise RuntimeError("no class")


class NbytesRaises:
    dtype = "float32"
    shape = (2,)

    @property
    def nbytes(self) -> int:
        raise MemoryError("nbytes")

    @property
    def __cuda_array_interface__(self) -> Any:
        raise RuntimeError("not on a device")


class LenRaises(list):
    def __len__(self) -> int:
        raise RuntimeError("len")


class IterForever(list):
    def __iter__(self) -> Any:
        return itertools.count()


class ValuesRaise(dict):
    def values(self) -> Any:
        raise RuntimeError("values")

    def __iter__(self) -> Any:
        raise RuntimeError("iter")


class EqHashRaise:
    def __eq__(self, other: object) -> bool:
        raise RuntimeError("eq")

    def __hash__(self) -> int:
        raise RuntimeError("hash")


class HashRaisingMeta(type):
    def __hash__(cls) -> int:
        raise RuntimeError("class hash")

    def __eq__(cls, other: object) -> bool:
        raise RuntimeError("class eq")


class WeirdType(metaclass=HashRaisingMeta):
    pass


class _Gone:
    pass


def junk_namespace(tensor: Any) -> dict[Any, Any]:
    cyclic: list[Any] = [tensor]
    cyclic.append(cyclic)
    looped: dict[str, Any] = {}
    looped["self"] = looped
    dead = _Gone()
    proxy = weakref.proxy(dead)
    del dead
    gc.collect()
    return {
        "shape_raises": ShapeRaises(),
        "getattr_raises": GetattrRaises(),
        "getattribute_raises": GetattributeRaises(),
        "class_raises": ClassRaises(),
        "nbytes_raises": NbytesRaises(),
        "len_raises": LenRaises([tensor]),
        "iter_forever": IterForever([tensor]),
        "values_raise": ValuesRaise(t=tensor),
        "eq_hash": [EqHashRaise(), {"k": EqHashRaise()}],
        "weird_types": [WeirdType, WeirdType()],
        "cyclic": cyclic,
        "looped": looped,
        "dead_proxy": proxy,
        "in_a_proxy_list": [proxy, tensor],
        7: tensor,  # a key that is not a string (globals()[7] = ...)
    }


def test_scanner_finds_tensors_among_junk_and_never_raises():
    t = FakeTensor(GiB)
    holders = Scanner({"torch": fake_torch()}).scan(junk_namespace(t))
    # The one tensor is attributed once, to some holder that really contains it.
    assert sum(h.nbytes for h in holders) == GiB
    assert holders[0].name in {"len_raises", "iter_forever", "values_raise", "cyclic",
                               "in_a_proxy_list"}


def test_a_huge_container_is_scanned_in_bounded_time():
    t = FakeTensor(GiB)
    ns = {"huge": [object() for _ in range(2_000_000)] + [t], "t_small": FakeTensor(MiB)}
    start = time.perf_counter()
    holders = Scanner({"torch": fake_torch()}).scan(ns)
    assert time.perf_counter() - start < hang_guard(10)
    assert ("t_small", MiB) in [(h.name, h.nbytes) for h in holders]


# -- in the real shell ---------------------------------------------------------------------------
@pytest.fixture
def junky(shell: Any, fake_gpu: Any, capsys: Any) -> Any:
    shell.run_cell("%load_ext gpumem_nb", store_history=True)
    shell.user_ns["cuda"] = fake_gpu.cuda
    shell.user_ns.update(junk_namespace(fake_gpu.cuda.tensor(MiB)))
    capsys.readouterr()
    return shell


def test_who_and_every_cleanup_mode_work_with_junk_in_the_namespace(junky):
    report = junky.run_line_magic("gpumem", "who -o")
    assert sum(h.nbytes for h in report.holders) == MiB
    junky.run_line_magic("gpumem", "cleanup --dry-run --out --vars shape_raises -o")
    junky.run_line_magic("gpumem", "cleanup --out --vars shape_raises,eq_hash -o")
    assert "shape_raises" not in junky.user_ns and "getattr_raises" in junky.user_ns


def test_rerun_detection_keeps_flagging_with_junk_in_the_namespace(junky, capsys):
    cell = "y = cuda.tensor(64 * 2**20)\ny"
    for _ in range(5):
        junky.run_cell(cell, store_history=True, cell_id="junk-y")
    flags = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("gpumem: cell")]
    assert len(flags) == 3 and all("Held by: Out[" in f for f in flags), flags


def test_a_cell_that_raises_with_junk_around_is_flagged_and_cleaned(junky, fake_gpu, capsys):
    junky.run_cell("def f():\n    big = cuda.tensor(2**30)\n    junk = shape_raises\n"
                   "    raise ValueError\nf()", store_history=True)
    assert "traceback: f() locals" in capsys.readouterr().out
    junky.run_line_magic("gpumem", "cleanup")
    assert fake_gpu.cuda.devices[0].allocated == MiB  # only the junk list's tensor is left


# -- junk allocator statistics ---------------------------------------------------------------
JUNK_STATS = [
    {"num_ooms": "many"},
    {"num_alloc_retries": "lots"},
    {"allocated_bytes": {"all": {"current": "1 GiB"}}},
]


def make_stats_junk(fake_gpu: Any, junk: dict[str, Any]) -> None:
    mem = fake_gpu.cuda.memory
    real = mem.memory_stats_as_nested_dict

    def junky(index: int) -> dict[str, Any]:
        stats = real(index)
        stats.update(junk)
        return stats

    mem.memory_stats_as_nested_dict = junky


@pytest.mark.parametrize("junk", JUNK_STATS)
def test_cleanup_and_who_work_when_allocator_stats_are_junk(shell, fake_gpu, junk):
    shell.run_cell("%load_ext gpumem_nb", store_history=True)
    make_stats_junk(fake_gpu, junk)
    report = shell.run_line_magic("gpumem", "cleanup -o")
    assert "empty_cache" in [s.step for s in report.steps]
    assert "empty_cache" in fake_gpu.cuda.calls
    shell.run_line_magic("gpumem", "who -o")


def test_cleanup_reports_instead_of_raising_when_a_reading_fails(shell, fake_gpu):
    shell.run_cell("%load_ext gpumem_nb", store_history=True)
    mon = current_monitor(shell)

    def junk_reading(**kw: Any) -> Any:
        raise ValueError("invalid literal for int() with base 10: 'many'")

    mon.read = junk_reading  # type: ignore[method-assign]
    report = shell.run_line_magic("gpumem", "cleanup -o")
    assert "empty_cache" in fake_gpu.cuda.calls
    assert "figures unknown: reading memory failed (ValueError" in report.steps[-1].did


@pytest.mark.parametrize("junk", [
    JUNK_STATS[0],
    JUNK_STATS[1],
    JUNK_STATS[2],
])
def test_cells_are_recorded_when_allocator_stats_are_junk(shell, fake_gpu, junk):
    shell.run_cell("%load_ext gpumem_nb", store_history=True)
    make_stats_junk(fake_gpu, junk)
    shell.user_ns["cuda"] = fake_gpu.cuda
    shell.run_cell("t = cuda.tensor(2**30)", store_history=True)
    rec = current_monitor(shell).history.records()[-1]
    assert rec.source_preview == "t = cuda.tensor(2**30)"
