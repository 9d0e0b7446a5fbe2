"""Bare storage objects against real PyTorch (skipped where torch is missing): read through
``torch._C.StorageBase``'s own descriptors, keyed as the tensors on them are, and found by the
walk, on whatever device this machine has."""

from __future__ import annotations

import sys
from typing import Any

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

from gpumem_nb.holders import Scanner  # noqa: E402
from gpumem_nb.holders.facts import TensorFacts  # noqa: E402


def test_a_real_storage_is_read_and_keyed_as_its_tensor():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    t = torch.empty(1 << 20, dtype=torch.uint8, device=dev)
    facts = TensorFacts(sys.modules)
    assert facts.storages is not None
    assert facts.info(t.untyped_storage()) == facts.info(t)


def test_a_registry_of_real_storages_is_a_holder_of_their_bytes():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    registry: dict[int, Any] = {}
    for _ in range(3):
        w = torch.empty(1 << 20, dtype=torch.uint8, device=dev)
        st = w.untyped_storage()
        registry[st.data_ptr()] = st
    del w, st
    (h,) = [h for h in Scanner().scan({"storage_registry": registry})
            if h.name == "storage_registry"]
    assert (h.nbytes, h.device.split(":")[0]) == (3 << 20, dev)
