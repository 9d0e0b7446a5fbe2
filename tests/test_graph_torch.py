"""The graph walk against real autograd graphs (CPU torch; skipped where torch is missing, as
in CI): what `who` credits to a holder is what dropping it frees.

The truth is taken another way: every storage an operator returned during the forward is
watched through a storage weak reference (a dispatch mode below autograd), and what dropping
the holder frees is the bytes of those that die with it.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import pytest

# Run by the GPU machine's ``pytest -m gpu`` (CI has no torch, so unmarked it ran nowhere).
pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

from torch.multiprocessing.reductions import StorageWeakRef  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from gpumem_nb.holders import Scanner  # noqa: E402
from gpumem_nb.model import Holder  # noqa: E402


class WatchStorages(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.made: dict[int, tuple[Any, int]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                s = t.untyped_storage()
                self.made[s._cdata] = (StorageWeakRef(s), s.nbytes())
        return out


def held_and_freed(ns: dict[str, Any], name: str, make: Callable[[], Any]) -> tuple[Holder, int]:
    watch = WatchStorages()
    with watch:
        ns[name] = make()
    alive = [(ref, n) for ref, n in watch.made.values() if not ref.expired()]
    (h,) = [h for h in Scanner().scan(ns) if h.name == name]
    del ns[name]
    gc.collect()
    return h, sum(n for ref, n in alive if ref.expired())


def mlp() -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[m for _ in range(4)
                                 for m in (torch.nn.Linear(256, 256), torch.nn.GELU())])


def test_an_outputs_graph_is_sized_to_what_dropping_it_frees():
    ns = {"model": mlp()}
    h, freed = held_and_freed(ns, "out", lambda: ns["model"](torch.randn(64, 256)))
    assert h.holds_graph and h.graph_bytes and not h.graph_bytes_capped
    assert h.held_bytes == freed  # parameters stay with the model, counted there


def test_a_loss_without_its_module_in_reach_still_leaves_parameters_out():
    model = mlp()
    ns: dict[str, Any] = {}
    h, freed = held_and_freed(ns, "loss", lambda: model(torch.randn(64, 256)).pow(2).mean())
    params = sum(p.untyped_storage().nbytes() for p in model.parameters())
    assert h.held_bytes == freed and params not in (0, h.graph_bytes)


def test_a_deleted_models_weights_are_counted_in_its_outputs_graph():
    """The model made and dropped inside the cell (``del model`` in a notebook): only the
    graph keeps its weights, and dropping the loss frees them too."""
    ns: dict[str, Any] = {}
    h, freed = held_and_freed(ns, "loss", lambda: mlp()(torch.randn(64, 256)).pow(2).mean())
    weights = 4 * (256 * 256 + 256) * 4
    assert h.held_bytes == freed and h.graph_bytes > weights


def test_after_backward_a_graph_holds_nothing_and_reading_it_raises_nothing():
    ns = {"model": mlp()}
    ns["loss"] = ns["model"](torch.randn(64, 256)).sum()
    ns["loss"].backward()
    (h,) = [h for h in Scanner().scan(ns) if h.name == "loss"]
    assert h.graph_bytes == 0 and h.graph_nodes


def test_checkpointed_and_hooked_graphs_are_never_unpacked():
    from torch.utils.checkpoint import checkpoint

    model, unpacked = mlp(), []
    x = torch.randn(64, 256)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: unpacked.append(1) or t):
        hooked = model(x).sum()
    ckpt = checkpoint(model, x.requires_grad_(), use_reentrant=False).sum()
    holders = {h.name: h for h in Scanner().scan({"hooked": hooked, "ckpt": ckpt,
                                                  "model": model})}
    assert unpacked == []
    assert holders["hooked"].graph_bytes  # an identity pack hook: the tensors themselves
    assert holders["ckpt"].graph_unsized  # checkpoint's holders: not tensors, not sized
    ckpt.backward()  # the recompute still works: nothing was consumed


def test_a_gpt2_built_from_a_config_is_accounted_in_full():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_embd=128, n_layer=2, n_head=4, n_positions=64,
                                  vocab_size=1000)
    model = transformers.GPT2LMHeadModel(cfg)
    ns = {"model": model, "ids": torch.randint(0, 1000, (2, 64))}
    h, freed = held_and_freed(ns, "logits", lambda: model(ns["ids"]).logits)
    assert h.graph_nodes and h.graph_nodes > 50
    # 48 bytes more than the watch saw: small tensors the model made outside any operator
    # (a mask's constants) are in the graph too. The bar is 90%.
    assert freed <= h.held_bytes <= freed + 4096
