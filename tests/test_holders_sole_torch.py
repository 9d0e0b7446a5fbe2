"""The reference-count proof of a ``del`` against real PyTorch (2.11 or later; skipped where
torch is missing): it proves a lone tensor freed and refuses a view, a saved tensor and a
storage someone holds."""

from __future__ import annotations

import sys
from typing import Any

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

from gpumem_nb.holders.sole import SoleProof  # noqa: E402


def frees(ns: dict[str, Any], name: str) -> bool:
    proof = SoleProof.of(sys.modules)
    if proof is None:
        pytest.skip("torch before 2.11, or without _storage_Use_Count")
    ts = [ns[name]]
    return proof.frees(ns, [name], ts, ours=[ts])


def test_a_lone_tensor_is_proved_and_a_view_a_graph_or_a_storage_holder_is_not():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    ns: dict[str, Any] = {"big": torch.empty(1 << 20, device=dev)}
    lone = frees(ns, "big")
    assert lone
    v = ns["big"][:16]
    viewed = frees(ns, "big")
    del v
    s = ns["big"].untyped_storage()
    stored = frees(ns, "big")
    del s
    w = torch.ones(1 << 20, device=dev, requires_grad=True)
    loss = (w * ns["big"]).sum()  # the graph saves big (for w's gradient)
    saved = frees(ns, "big")
    del loss, w
    assert (viewed, stored, saved) == (False, False, False)
    assert frees(ns, "big")
