"""On the real GPU, with real torch: looking at tensors and modules runs none of the user's code
(reliability re-test 2026-12-05, A1 and A2), and the bytes are still found.

A ``torch.Tensor`` subclass's ``__torch_function__`` runs on every attribute read and method
call (``.device``, ``.untyped_storage()``, ``.grad``, ``.shape``) unless torch function is
disabled; an ``nn.Module``'s ``parameters()``/``buffers()`` and an optimizer's ``state`` are
the user's to override. The walk reads torch.Tensor's own descriptors inside
``torch._C.DisableTorchFunction`` and each module's and optimizer's own ``__dict__``.

Sizes are small and fixed (a few MiB): nothing here depends on the card.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from gpumem_nb.holders import Scanner

pytestmark = pytest.mark.gpu
MiB = 1 << 20

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - the GPU machine has one
    pytest.skip("needs CUDA", allow_module_level=True)

ran: list[str] = []


class Counting(torch.Tensor):
    """A tensor subclass whose ``__torch_function__`` counts every call torch routes to it."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None):
        ran.append(getattr(func, "__name__", repr(func)))
        return super().__torch_function__(func, types, args, kwargs or {})


def storage_bytes(t: Any) -> int:
    """Outside the counted window: the base class's view of the same storage."""
    with torch._C.DisableTorchFunction():
        return int(torch.Tensor.untyped_storage(t).nbytes())


def cuda_bytes(holders: list[Any], name: str) -> int:
    return sum(h.held_bytes for h in holders if h.name == name and h.device.startswith("cuda"))


def test_a_tensor_subclass_with_torch_function_is_read_without_running_it():
    xs = [torch.empty(4 * MiB, dtype=torch.uint8, device="cuda").as_subclass(Counting)
          for _ in range(10)]
    # A leaf (as_subclass of a tensor that requires grad would be an alias, not a leaf).
    w = torch.zeros(MiB // 4, device="cuda").as_subclass(Counting).requires_grad_()
    w.grad = torch.ones(MiB // 4, device="cuda")
    expected_xs = sum(storage_bytes(x) for x in xs)
    expected_w = storage_bytes(w) + storage_bytes(torch.Tensor.grad.__get__(w))
    ran.clear()
    holders = Scanner(sys.modules).scan({"xs": xs, "w": w})
    assert ran == []
    assert cuda_bytes(holders, "xs") == expected_xs
    assert cuda_bytes(holders, "w") == expected_w


def test_a_torch_function_mode_active_during_the_look_is_not_run():
    from torch.overrides import TorchFunctionMode

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None):
            ran.append(f"mode {getattr(func, '__name__', func)}")
            return func(*args, **(kwargs or {}))

    t = torch.empty(2 * MiB, dtype=torch.uint8, device="cuda")
    expected = storage_bytes(t)
    ran.clear()
    with Mode():
        holders = Scanner(sys.modules).scan({"t": t})
    assert ran == []
    assert cuda_bytes(holders, "t") == expected


def test_a_modules_overridden_parameters_and_an_optimizers_state_property_never_run():
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = torch.nn.Linear(512, 512)
            self.norm = torch.nn.BatchNorm1d(512)

        def forward(self, x: Any) -> Any:
            return self.norm(self.body(x))

        def parameters(self, recurse: bool = True):
            ran.append("parameters")
            return super().parameters(recurse)

        def buffers(self, recurse: bool = True):
            ran.append("buffers")
            return super().buffers(recurse)

        def named_modules(self, *a: Any, **kw: Any):
            ran.append("named_modules")
            return super().named_modules(*a, **kw)

    class Adam(torch.optim.Adam):
        @property
        def state(self):
            ran.append("state")
            return self.__dict__["state"]

        @state.setter
        def state(self, value: Any) -> None:
            self.__dict__["state"] = value

    net = Net().cuda()
    opt = Adam(list(torch.nn.Module.parameters(net)), lr=1e-3)
    net(torch.randn(8, 512, device="cuda")).sum().backward()
    opt.step()
    params = list(torch.nn.Module.parameters(net))
    expected_net = sum(storage_bytes(p) + storage_bytes(p.grad) for p in params) + sum(
        storage_bytes(b) for b in torch.nn.Module.buffers(net))
    state = opt.__dict__["state"]
    expected_opt = sum(storage_bytes(v) for s in state.values() for v in s.values()
                       if isinstance(v, torch.Tensor) and v.is_cuda)
    ran.clear()
    holders = Scanner(sys.modules).scan({"net": net, "opt": opt})
    assert ran == []
    assert cuda_bytes(holders, "net") == expected_net
    assert cuda_bytes(holders, "opt") == expected_opt
