"""The holder scan: names the right things, counts shared storage once, stays fast."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from gpumem_nb.holders import Scanner

from .fakes import FakeCuda, FakeTensor, GiB, MiB, fake_torch


class Module:
    def __init__(self, *tensors: FakeTensor) -> None:
        self._t = tensors

    def parameters(self):
        return iter(self._t)

    def buffers(self):
        return iter(())


class Optimizer:
    def __init__(self, state: dict) -> None:
        self.state = state


def torch_with_nn() -> SimpleNamespace:
    t = fake_torch(FakeCuda(initialized=True))
    t.nn = SimpleNamespace(Module=Module)
    t.optim = SimpleNamespace(Optimizer=Optimizer)
    return t


def scan(ns: dict, **kw) -> list:
    return Scanner({"torch": torch_with_nn()}).scan(ns, **kw)


def test_tensors_inside_modules_optimizers_lists_and_dicts_are_found():
    p = FakeTensor(GiB)
    ns = {
        "model": Module(p, FakeTensor(MiB)),
        "opt": Optimizer({p: {"exp_avg": FakeTensor(GiB), "exp_avg_sq": FakeTensor(GiB)}}),
        "batch": [FakeTensor(4 * MiB), {"mask": FakeTensor(MiB)}],
        "n": 3,
    }
    got = {(h.name, h.kind): h.nbytes for h in scan(ns)}
    assert got == {("model", "module"): GiB + MiB, ("opt", "optimizer state"): 2 * GiB,
                   ("batch", "container"): 5 * MiB}


def test_a_tensor_reachable_twice_is_counted_once_under_the_variable():
    t = FakeTensor(GiB)
    holders = scan({"y": t, "_": t, "_7": t}, output_cache={7: t})
    assert [(h.name, h.nbytes) for h in holders] == [("y", GiB)]


def test_output_cache_entries_carry_their_aliases():
    t = FakeTensor(GiB)
    holders = scan({"_": t, "_7": t}, output_cache={7: t})
    assert [(h.name, h.kind) for h in holders] == [("Out[7] (also _)", "output cache")]


def test_stored_loss_is_called_out_for_keeping_its_graph():
    loss = FakeTensor(4, grad_fn=type("MulBackward0", (), {})())
    (h,) = scan({"loss": loss})
    assert "grad_fn=MulBackward0 (keeps its autograd graph)" in h.detail


def test_traceback_locals_are_attributed_to_the_frame():
    def f() -> None:
        big = FakeTensor(2 * GiB)  # noqa: F841 - held by the frame
        raise ValueError

    try:
        f()
    except ValueError as e:
        err = e
    (h,) = scan({}, last_exception=[err])
    assert (h.name, h.kind, h.nbytes) == ("traceback: f() locals", "traceback", 2 * GiB)


def test_without_torch_numpy_arrays_are_still_reported_as_host_memory():
    holders = Scanner({}).scan({"a": np.zeros(1000), "b": [np.ones(10)]})
    assert [(h.name, h.device, h.nbytes) for h in holders] == [("a", "cpu", 8000),
                                                               ("b", "cpu", 80)]


def test_a_tensor_among_a_million_plain_objects_is_still_found():
    # benchmarks/bench_who.py times this namespace; here only the answer matters.
    ns: dict = {f"v{i}": i for i in range(200_000)}
    ns["big_list"] = list(range(1_000_000))
    ns["big_dict"] = {i: float(i) for i in range(300_000)}
    ns["nested"] = [[FakeTensor(GiB)]]
    assert [(h.name, h.nbytes) for h in scan(ns)] == [("nested", GiB)]
