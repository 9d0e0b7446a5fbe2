"""Pure analysis: the peak rules and the accumulation classifier, table-driven."""

from __future__ import annotations

import pytest

from gpumem_nb.analysis import AccumulationTracker, cell_peak, classify
from gpumem_nb.model import (
    CAUSE_CACHE,
    CAUSE_LIVE_TENSORS,
    CAUSE_OUTSIDE,
    AllocatorReading,
    CellDevice,
    CellRecord,
)

from .fakes import GiB, MiB

T = 16 * MiB


def alloc(allocated: int, peak: int, reserved: int | None = None) -> AllocatorReading:
    r = reserved if reserved is not None else allocated
    return AllocatorReading(allocated, r, allocated, 0, peak, r, 0, 0)


@pytest.mark.parametrize(
    ("before", "after", "sampled", "reset", "expected"),
    [
        # The cell set a new process-wide peak: exact without resetting anything.
        (alloc(GiB, GiB), alloc(GiB, 9 * GiB), None, False, (9 * GiB, True)),
        # CUDA came up during the cell: the whole peak belongs to it.
        (None, alloc(0, 2 * GiB), None, False, (2 * GiB, True)),
        # Peaks reset at the start (on request): exact.
        (alloc(GiB, GiB), alloc(GiB, 3 * GiB), None, True, (3 * GiB, True)),
        # Below an earlier peak: the best honest answer is a lower bound.
        (alloc(GiB, 9 * GiB), alloc(2 * GiB, 9 * GiB), 5 * GiB, False, (5 * GiB, False)),
        (alloc(GiB, 9 * GiB), alloc(2 * GiB, 9 * GiB), None, False, (2 * GiB, False)),
        # The user reset the peak inside the cell: what followed is known.
        (alloc(GiB, 9 * GiB), alloc(GiB, 4 * GiB), None, False, (4 * GiB, False)),
        # No allocator at all.
        (None, None, None, False, (None, False)),
    ],
)
def test_cell_peak_is_exact_only_when_it_can_be(before, after, sampled, reset, expected):
    assert cell_peak(before, after, sampled, reset_at_start=reset) == expected


def dev(alloc_d: int | None = 0, reserved_d: int | None = 0, proc_d: int | None = 0,
        nvml_d: int | None = 0) -> CellDevice:
    def pair(d: int | None) -> tuple[int | None, int | None]:
        return (None, None) if d is None else (10 * GiB, 10 * GiB + d)

    a, r, p, n = pair(alloc_d), pair(reserved_d), pair(proc_d), pair(nvml_d)
    return CellDevice(0, a[0], a[1], r[0], r[1], None, False, n[0], n[1], None, p[0], p[1])


@pytest.mark.parametrize(
    ("device", "expected"),
    [
        (dev(alloc_d=64 * MiB, reserved_d=64 * MiB, proc_d=64 * MiB),
         (CAUSE_LIVE_TENSORS, 64 * MiB)),
        (dev(alloc_d=0, reserved_d=512 * MiB, proc_d=512 * MiB), (CAUSE_CACHE, 512 * MiB)),
        (dev(alloc_d=0, reserved_d=0, proc_d=300 * MiB), (CAUSE_OUTSIDE, 300 * MiB)),
        (dev(alloc_d=T - 1, reserved_d=T - 1, proc_d=T - 1), None),  # under the threshold
        (dev(alloc_d=-GiB, reserved_d=0, proc_d=0), None),  # shrinking is never a flag
        # No torch and no per-process figure: the device total is all there is.
        (dev(alloc_d=None, reserved_d=None, proc_d=None, nvml_d=GiB), (CAUSE_OUTSIDE, GiB)),
        (dev(alloc_d=0, reserved_d=0, proc_d=None, nvml_d=GiB), None),
    ],
)
def test_growth_is_classified_by_which_measure_grew(device, expected):
    assert classify(device, T) == expected


def record(key: str, d: CellDevice, raised: bool = False) -> CellRecord:
    return CellRecord(1, key, "", 0.0, 0.1, (d,), None, None, raised=raised)


def test_flag_needs_two_growing_reruns_in_a_row_and_repeats_once_per_growth():
    tracker = AccumulationTracker(T)
    grow, flat = dev(alloc_d=64 * MiB), dev()
    runs = [grow, grow, grow, grow, flat, grow, grow]
    flagged = [tracker.observe(record("c", d)) is not None for d in runs]
    assert flagged == [False, False, True, True, False, False, True]


def test_runs_of_other_cells_do_not_count_towards_a_cell():
    tracker = AccumulationTracker(T)
    grow = dev(alloc_d=64 * MiB)
    assert [tracker.observe(record(k, grow)) for k in ("a", "b", "c", "d")] == [None] * 4


def test_a_cell_that_raised_and_kept_memory_is_flagged_on_its_first_run():
    v = AccumulationTracker(T).observe(record("x", dev(alloc_d=GiB), raised=True))
    assert v is not None and v.raised and v.cause == CAUSE_LIVE_TENSORS and v.runs == 1


def test_a_stored_loss_is_named_even_though_its_own_storage_is_tiny():
    from gpumem_nb.analysis import top_holders
    from gpumem_nb.model import Holder

    holders = [Holder(f"big{i}", "variable", "cuda:0", GiB) for i in range(6)]
    # Ranked by the field, not by wording in the detail text.
    holders.append(Holder("losses", "container", "cuda:0", 12, "3 tensors", holds_graph=True))
    named = [h.name for h in top_holders(holders, CAUSE_LIVE_TENSORS)]
    assert named[0] == "losses" and len(named) == 5


def test_a_failed_loop_that_kept_its_graphs_in_a_list_is_told_about_the_list_first():
    """Tutorial 04's review (M2): a loss list held 135 GiB of graphs and the traceback 1.75 GiB,
    yet the line led with "the stored exception keeps the failed cell's local tensors"."""
    from gpumem_nb.analysis import Verdict, verdict_message
    from gpumem_nb.model import Holder

    v = Verdict("cell-1", 11, runs=1, device=0, growth_bytes=136 * GiB,
                cause=CAUSE_LIVE_TENSORS, raised=True)
    losses = Holder("losses", "container", "cuda:0", 240, "60 tensors", holds_graph=True,
                    graph_bytes=135 * GiB)
    tb = Holder("traceback: forward() locals", "traceback", "cuda:0", GiB)
    text = verdict_message(v, [losses, tb])
    assert "stored exception keeps" not in text and "still referenced" in text, text
    assert "stored exception keeps" in verdict_message(v, [tb])  # the traceback's own doing
