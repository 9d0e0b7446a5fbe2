"""The H200 harness's merge step (benchmarks/gpu_diagnosis2.py --merge): re-measured rows
replace their own, every other row keeps its provenance, and tuning is said."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from benchmarks import gpu_diagnosis2 as d2

pytestmark = pytest.mark.slow  # a benchmark script's merge, not the extension

# Rows of benchmarks/results/diagnosis2_h200.json as they were before a merge re-measured
# them (its second H200 call), so that the tests do not change with the file they protect.
RESULTS = os.path.join(os.path.dirname(__file__), "data", "diagnosis2_before_round3.json")


def _fresh(kind: str, allocator: str, **kw: Any) -> dict[str, Any]:
    k = next(k for k in d2.KINDS if k.kind == kind)
    return d2.base_row(k, allocator) | {"verdict": k.expected,
                                        "allocated_at_failure_bytes": 100,
                                        "attributed_bytes": 100, "not_found_bytes": 0} | kw


def test_a_merge_replaces_only_the_remeasured_rows_and_keeps_the_others_provenance():
    with open(RESULTS) as f:
        old = json.load(f)
    new = [_fresh("class_attribute_cache", "native",
                  holders=[{"name": "Bottleneck.out_saved", "estimate_bytes": 100,
                            "freed_bytes": 101}]),
           _fresh("generate_batch_too_big", "cudaMallocAsync", not_found_bytes=30)]
    merged = d2.merge(old, new, "H200 call 3", "abc1234")
    by = {(r["kind"], r["allocator"]): r for r in merged}
    # Untouched rows: exactly as they were.
    untouched = [r for r in old if (r["kind"], r["allocator"]) in by
                 and (r["kind"], r["allocator"]) not in {(n["kind"], n["allocator"]) for n in new}]
    assert all(by[(r["kind"], r["allocator"])] == r for r in untouched)
    row = by[("class_attribute_cache", "native")]
    assert row["run"] == "H200 call 3" and row["commit"] == "abc1234"
    assert row["tuned_after_seeing"] is True  # out of sample, re-measured after a rule change
    assert row["replaces"]["run"].startswith("H200 call 2")
    assert "note" not in row and row["holders"][0]["estimate_within_5pct"] is True
    gen = by[("generate_batch_too_big", "cudaMallocAsync")]
    assert "tuned_after_seeing" not in gen  # in sample: tuning on it is allowed
    assert "not found 30 B is 30%" in gen["note"]
    assert [r["kind"] for r in merged if (r["kind"], r["allocator"]) in by] == \
        [r["kind"] for r in merged]


def test_rows_of_a_kind_that_does_not_exist_under_their_allocator_are_dropped():
    with open(RESULTS) as f:
        old = json.load(f)
    merged = d2.merge(old, [], "H200 call 3", "abc1234")
    keys = {(r["kind"], r["allocator"]) for r in merged}
    assert ("mempool_keeps_segment", "cudaMallocAsync") not in keys
    assert ("cuda_graph_capture_pool", "cudaMallocAsync") not in keys
    assert len(merged) == len(old) - 2


def test_a_row_that_never_ran_keeps_its_note():
    row = d2.base_row(d2.KINDS[0], "native") | {"note": "timed out"}
    assert d2.judged(row)["note"] == "timed out"
