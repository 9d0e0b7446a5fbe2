"""The GPU suite runs on any card, in shards that each fit one device call (issue 36): a child
asking a fixed 100 GiB failed on an 80 GB H100, and the shards' list lived only in a script.
Checked here without a GPU: sizes are written as the card's share, and every GPU test file
belongs to exactly one shard."""

from __future__ import annotations

import re
from pathlib import Path

from tests.gpu.helpers import H200_TOTAL_BYTES, scaled_gib

ROOT = Path(__file__).resolve().parent.parent
GPU = ROOT / "tests" / "gpu"
# A literal size in GiB written as N * 2**30 or N * (1 << 30): more than this many GiB does not
# fit every card the suite runs on, unless it is meant to fail everywhere (400 GiB and more).
_LITERAL_GIB = re.compile(r"\b([0-9]+)\s*\*\s*(?:2\s*\*\*\s*30|\(1\s*<<\s*30\))")
_FITS_ANY_CARD_GIB = 8
_IMPOSSIBLE_GIB = 400


def test_scaled_gib_is_the_h200s_gib_there_and_the_same_share_elsewhere():
    assert scaled_gib(int(H200_TOTAL_BYTES)) == 2**30
    h100 = int(79.19 * 2**30)
    g = scaled_gib(h100)
    assert g % 2**21 == 0
    assert abs(60 * g / h100 - 60 * 2**30 / H200_TOTAL_BYTES) < 0.002


def test_no_gpu_test_asks_a_fixed_size_that_only_a_large_card_holds():
    found = []
    for path in sorted(GPU.glob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for m in _LITERAL_GIB.finditer(line):
                gib = int(m.group(1))
                if _FITS_ANY_CARD_GIB < gib < _IMPOSSIBLE_GIB:
                    found.append(f"{path.name}:{n}: {line.strip()}")
    assert not found, found


def _shard_lists() -> dict[str, list[str]]:
    text = (ROOT / "benchmarks" / "gpu_tests.sh").read_text()
    out = {}
    for name in ("A", "C", "D"):
        m = re.search(rf"^{name}=\(([^)]*)\)", text, re.M)
        assert m is not None, name
        out[name] = m.group(1).split()
    return out


def test_every_gpu_test_file_is_in_exactly_one_shard_and_each_listed_file_exists():
    lists = _shard_lists()
    named = [f for files in lists.values() for f in files]
    assert len(named) == len(set(named)), named
    for f in named:
        assert (ROOT / f).exists(), f
    shards = (ROOT / "tests" / "gpu" / "SHARDS.md").read_text()
    for path in sorted(GPU.glob("test_*.py")):
        rel = f"tests/gpu/{path.name}"
        # Shard b takes every file the others do not name; SHARDS.md names each file.
        assert path.name in shards, f"tests/gpu/SHARDS.md does not list {rel}"


def test_the_tests_shard_b_may_skip_without_jupytext_hold_no_gpu_test():
    # gpu_tests.sh leaves these out where jupytext is missing (the GPU machine's wheels): a gpu
    # test added to one of them would then never run.
    text = (ROOT / "benchmarks" / "gpu_tests.sh").read_text()
    m = re.search(r"^TUTORIAL_TESTS=\(([^)]*)\)", text, re.M)
    assert m is not None
    files = m.group(1).split()
    assert files
    for f in files:
        source = (ROOT / f).read_text()
        assert "mark.gpu" not in source and "gpu" not in re.findall(r"pytestmark\s*=.*", source), f
