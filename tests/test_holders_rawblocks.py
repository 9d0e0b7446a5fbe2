"""Raw pointers from ``torch.cuda.caching_allocator_alloc`` kept as ints (KINDS8
kernel_workspaces_raw_allocator_pointers: 99.9% "not found", no Python object holds the
memory): the allocated blocks no tensor covers are told from the snapshot, and an int equal to
a block's address is named where the notebook or a module keeps it, with the line that frees
exactly that block."""

from __future__ import annotations

import sys
import types
from typing import Any

from gpumem_nb.holders.rawblocks import RawBlock, pointer_paths, raw_blocks, uncovered_blocks

GiB = 1 << 30
BASE = 0x7F00_0000_0000


def segments() -> list[dict[str, Any]]:
    """One segment of four blocks: a tensor's, two raw workspaces, a free one; a second
    segment (another device) is not read."""
    return [
        {"device": 0, "address": BASE, "total_size": 7 * GiB, "blocks": [
            {"size": GiB, "state": "active_allocated"},       # the tensor's
            {"size": 2 * GiB, "state": "active_allocated"},   # raw
            {"size": GiB, "state": "inactive"},
            {"size": 3 * GiB, "state": "active_allocated"}]},  # raw
        {"device": 1, "address": BASE, "total_size": GiB, "blocks": [
            {"size": GiB, "state": "active_allocated"}]},
    ]


def test_blocks_no_tensor_covers_are_told_with_their_addresses_largest_first():
    tensor = (BASE + 1024, 4096)  # a view inside the first block covers it
    assert uncovered_blocks(segments(), 0, [tensor]) == [
        (BASE + 4 * GiB, 3 * GiB), (BASE + GiB, 2 * GiB)]


def test_an_int_equal_to_a_blocks_address_is_named_in_a_modules_dict_and_in_a_variable():
    mod = types.ModuleType("gm_raw_kernels")
    mod._WORKSPACES = {"attn0": BASE + GiB, "attn1": BASE + 4 * GiB}  # type: ignore[attr-defined]
    sys.modules["gm_raw_kernels"] = mod
    try:
        ns: dict[str, Any] = {"kernels": mod, "ptr": BASE + 4 * GiB, "n": 7}
        found = pointer_paths([BASE + GiB, BASE + 4 * GiB, BASE + 9 * GiB], ns, sys.modules)
        assert found == {BASE + GiB: "kernels._WORKSPACES['attn0']", BASE + 4 * GiB: "ptr"}
        block = RawBlock(BASE + GiB, 2 * GiB, found[BASE + GiB])
        assert block.code == \
            "torch.cuda.caching_allocator_delete(kernels._WORKSPACES['attn0'])"
    finally:
        del sys.modules["gm_raw_kernels"]


def test_no_code_of_a_user_container_or_int_subclass_runs_while_pointers_are_looked_for():
    calls: list[str] = []

    class Ptr(int):
        def __eq__(self, other: object) -> bool:
            calls.append("eq")
            return True

        __hash__ = int.__hash__

    class Registry(dict):  # type: ignore[type-arg]
        def items(self) -> Any:
            calls.append("items")
            return super().items()

    ns: dict[str, Any] = {"p": Ptr(BASE), "reg": Registry(w=BASE)}
    assert pointer_paths([BASE], ns, {}) == {}
    assert calls == []


def test_the_blocks_a_holders_storages_leave_are_given_with_the_line_for_each_named_pointer():
    ns: dict[str, Any] = {"ws": [BASE + GiB]}
    blocks = raw_blocks(segments(), 0, [(BASE, GiB)], ns, {})
    assert blocks == [RawBlock(BASE + 4 * GiB, 3 * GiB, ""),
                      RawBlock(BASE + GiB, 2 * GiB, "ws[0]")]
    assert [b.code for b in blocks] == [
        "", "torch.cuda.caching_allocator_delete(ws[0])"]
