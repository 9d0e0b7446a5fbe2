"""On the real GPU: the what-if's predictions for traced cells equal what the real allocator
reserves, to the byte, under the setting the cell ran with and under the other one (each in
a fresh process); and a fragmentation OOM's what-if line ("fits") is what a process with
expandable segments really does.

Run: ``pytest -m gpu tests/gpu/test_whatif_gpu.py -s`` (about 40 s).
"""

from __future__ import annotations

import pytest

from gpumem_nb.units import format_bytes

from .helpers import fresh

pytestmark = pytest.mark.gpu
MiB = 1 << 20

PRELUDE = """
        import json, torch
        from IPython.testing.globalipapp import start_ipython
        ip = start_ipython()
        MiB = 2**20
        ip.user_ns.update(torch=torch, MiB=MiB)
        torch.zeros(1, device="cuda"); torch.cuda.synchronize()
        ip.run_cell("%load_ext gpumem_nb", store_history=True)
        from gpumem_nb.magics import current_monitor
        mon = current_monitor(ip)
        def t(n):
            return f"torch.empty({n} * MiB, dtype=torch.uint8, device='cuda')"
"""
NATIVE = {"PYTORCH_CUDA_ALLOC_CONF": "", "PYTORCH_ALLOC_CONF": ""}
EXPANDABLE = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "PYTORCH_ALLOC_CONF": ""}

# The three known answers: (cell, native MiB, expandable MiB) above the baseline.
PATTERNS = {
    "8x16 freed, 4x32": ("xs = [{16} for _ in range(8)]\ndel xs\nys = [{32} for _ in range(4)]",
                         256, 140),
    "4x32 freed, 8x16": ("xs = [{32} for _ in range(4)]\ndel xs\nys = [{16} for _ in range(8)]",
                         128, 140),
    "8x16 every other freed, 2x32": ("xs = [{16} for _ in range(8)]\ndel xs[1::2]\n"
                                     "ys = [{32} for _ in range(2)]", 192, 180),
}

RUN_PATTERNS = PRELUDE + """
        out = {}
        for name, cell in PATTERNS.items():
            cell = cell.replace("{16}", t(16)).replace("{32}", t(32))
            base = torch.cuda.memory_reserved()
            torch.cuda.reset_peak_memory_stats()
            ip.run_cell("%%gpumem --trace -q\\n" + cell, store_history=True)
            real = torch.cuda.max_memory_reserved() - base
            r = ip.run_line_magic("gpumem", "whatif -o --conf expandable_segments:True --conf ''")
            rows = {x.label: x.peak_reserved_bytes - x.start_reserved_bytes for x in r}
            current = next(x.label for x in r if x.current)
            out[name] = {"real": real, "current": current, "rows": rows}
            ip.run_cell("xs = ys = None; torch.cuda.empty_cache()", store_history=True)
        print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def both() -> dict[str, dict[str, dict[str, object]]]:
    code = RUN_PATTERNS.replace("PATTERNS.items()", repr({k: v[0] for k, v in PATTERNS.items()})
                                + ".items()")
    return {"native": fresh(code, env=NATIVE), "expandable": fresh(code, env=EXPANDABLE)}


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_known_patterns_are_predicted_to_the_byte_under_both_settings(both, pattern):
    _, native_mib, expandable_mib = PATTERNS[pattern]
    nat, exp = both["native"][pattern], both["expandable"][pattern]
    print(f"\nWHATIF {pattern}: real native {nat['real'] / MiB:.0f} MiB, expandable "
          f"{exp['real'] / MiB:.0f} MiB; predicted from the native trace {nat['rows']}, "
          f"from the expandable one {exp['rows']}")
    assert nat["real"] == native_mib * MiB and exp["real"] == expandable_mib * MiB
    assert nat["current"] == "defaults" and exp["current"] == "expandable_segments:True"
    # Each trace predicts its own run and the other one.
    for rows in (nat["rows"], exp["rows"]):
        assert rows["defaults"] == native_mib * MiB
        assert rows["expandable_segments:True"] == expandable_mib * MiB


FRAGMENTED = PRELUDE + """
        base = torch.cuda.memory_reserved()
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction((base + 150 * MiB) / total, 0)
        cell = f"a = {t(100)}\\ndel a\\nb = {t(30)}\\nc = {t(80)}"
        ip.run_cell("%%gpumem --trace -q\\n" + cell, store_history=True)
        e = mon.oom.last
        print(json.dumps({"oom": e is not None, "notes": list(e.notes) if e else [],
                          "base": base, "peak": torch.cuda.max_memory_reserved()}))
"""


def test_a_fragmentation_oom_gives_the_real_expandable_peak_and_no_outcome_its_start_decides():
    """The cell starts on a segment the native setting made (CUDA's first tensor), which a
    kernel restarted under expandable segments would not have: the line gives the replayed
    peak, which the real run under expandable segments reaches, and no fits/OOM verdict
    (issue 25: a traced cell's replay cannot answer "restart under X")."""
    native = fresh(FRAGMENTED, env=NATIVE)
    expandable = fresh(FRAGMENTED, env=EXPANDABLE)
    print(f"\nWHATIF fragmentation OOM: native {native}\nexpandable {expandable}")
    assert native["oom"]
    line = next(n for n in native["notes"] if n.startswith("Replayed under expandable"))
    assert "this cell alone" in line and "no outcome is predicted" in line
    assert "(fits in the" not in line and "still out of memory" not in line
    assert not expandable["oom"]  # the real allocator agrees
    assert native["base"] == expandable["base"]
    assert f"peaked at {format_bytes(expandable['peak'])} reserved" in line
