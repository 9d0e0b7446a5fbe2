"""Issue 24's gaps measured on the H200 (diagnosis2_h200.json): holders the forward walk did
not reach (a class-level attribute, an exception kept in a variable), cuBLAS's cached
workspaces left in "not found", and the cudaMallocAsync verdict that conservation decides."""

from __future__ import annotations

from typing import Any

from gpumem_nb.holders import Scanner

from .fakes import FakeTensor, GiB, fake_torch


# -- holders the forward walk did not reach ------------------------------------------------------
class CellBottleneck:
    """A class as a notebook cell defines it (its module is __main__)."""

    out_saved: list[Any] = []  # noqa: RUF012 (the class-level cache is what users write)
    scale = 2.0

    def forward(self) -> None:  # a method: no state, never walked as a holder's
        return None


CellBottleneck.__module__ = "__main__"


def test_a_tensor_in_a_user_class_attribute_is_found_through_an_instance():
    # H200, class_attribute_cache: 60 GiB in `Bottleneck.out_saved` stayed 100% "not found".
    CellBottleneck.out_saved.append(FakeTensor(10 * GiB))
    try:
        found = Scanner({"torch": fake_torch()}).scan({"block": CellBottleneck(),
                                                       "other": CellBottleneck()})
        (h,) = found
        assert (h.name, h.nbytes) == ("block", 10 * GiB)
        assert "CellBottleneck.out_saved" in str(h)
    finally:
        CellBottleneck.out_saved.clear()


def test_a_librarys_class_attributes_are_not_entered():
    class LibraryThing:
        cached: list[Any] = []  # noqa: RUF012

    LibraryThing.__module__ = "somelib.things"
    LibraryThing.cached.append(FakeTensor(GiB))
    assert Scanner({"torch": fake_torch()}).scan({"thing": LibraryThing()}) == []


def test_an_exception_kept_in_a_variable_holds_its_frames_locals():
    # H200, exception_kept_in_variable: `err = caught` kept 60 GiB of a finished frame's locals.
    def step() -> None:
        acts = FakeTensor(6 * GiB)  # noqa: F841 (kept by the traceback)
        raise RuntimeError("nan")

    try:
        step()
    except RuntimeError as caught:
        ns = {"err": caught}
    (h,) = Scanner({"torch": fake_torch()}).scan(ns)
    assert (h.name, h.nbytes) == ("err", 6 * GiB)
    ns.clear()


def test_an_exceptions_context_is_followed_too():
    def inner() -> None:
        kept = FakeTensor(3 * GiB)  # noqa: F841
        raise KeyError("x")

    def outer() -> None:
        try:
            inner()
        except KeyError:
            raise ValueError("wrapped") from None

    try:
        outer()
    except ValueError as caught:
        ns = {"err": caught}
    (h,) = Scanner({"torch": fake_torch()}).scan(ns)
    assert h.nbytes == 3 * GiB
    ns.clear()
