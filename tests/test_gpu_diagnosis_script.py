"""benchmarks/gpu_diagnosis.py runs end to end before it meets the GPU: its dry run (CPU
torch, tiny sizes, the OOMs raised by hand) drives the same subprocesses, IPython shells and
rows. Skipped without torch, as in CI; no verdict is asserted (a dry run has no GPU)."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("torch")

from benchmarks.gpu_diagnosis import EXPECTED, GROUPS, run_all, summary

# Run by the GPU machine's ``pytest -m gpu`` (CI has no torch, so unmarked it ran nowhere).
pytestmark = pytest.mark.gpu


def test_the_dry_run_writes_a_row_per_workload_with_its_explanation(tmp_path: Any):
    rows = run_all(str(tmp_path), dry=True, allocators=["native"], groups=["cupy", "jax"])
    assert [r["workload"] for r in rows] == GROUPS["cupy"] + GROUPS["jax"]
    for r in rows:
        assert not r.get("error"), r.get("traceback")
        assert r["expected"] == EXPECTED[r["workload"]] and r["verdict"]
        assert r["explain_ms"] is not None and "Cause:" in r["text"]
    on_disk = json.loads((tmp_path / "diagnosis_h200.json").read_text())
    assert [r["workload"] for r in on_disk] == [r["workload"] for r in rows]
    assert "as expected" in summary(rows)
