"""The allocator what-if's model: answers measured on the H200 reproduced to the byte, each
rule of the native caching allocator on its own, and the invariants any allocator keeps."""

from __future__ import annotations

import pickle
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumem_nb.whatif import api as w
from gpumem_nb.whatif.allocator import Limits
from gpumem_nb.whatif.config import SettingError, parse_settings
from gpumem_nb.whatif.replay import EMPTY_CACHE, compile_trace, replay
from gpumem_nb.whatif.rules import (
    SIZE_MAX,
    get_allocation_size,
    kSmallBuffer,
    round_size,
    should_split,
)

from .whatif_history import History

MiB = 1 << 20
GiB = 1 << 30
NATIVE, EXPANDABLE = "", "expandable_segments:True"


def peaks(h: History, *settings_: str, capacity: int | None = None) -> list[int]:
    return [r.peak_reserved_bytes for r in w.whatif(h.snapshot(), list(settings_),
                                                     capacity_bytes=capacity)]


# ------------------------------------------------------------------------------------------
# Known answers: reserved MiB above the baseline, measured on the H200 with torch 2.11.
# ------------------------------------------------------------------------------------------
def test_8x16_mib_freed_then_4x32_mib_reserves_256_native_and_140_expandable():
    h = History()
    xs = [h.alloc(16 * MiB) for _ in range(8)]
    for x in xs:
        h.free(x)
    for _ in range(4):
        h.alloc(32 * MiB)
    assert peaks(h, NATIVE, EXPANDABLE) == [256 * MiB, 140 * MiB]


def test_4x32_mib_freed_then_8x16_mib_reserves_128_native_and_140_expandable():
    h = History()
    xs = [h.alloc(32 * MiB) for _ in range(4)]
    for x in xs:
        h.free(x)
    for _ in range(8):
        h.alloc(16 * MiB)
    assert peaks(h, NATIVE, EXPANDABLE) == [128 * MiB, 140 * MiB]


def test_8x16_mib_every_other_freed_then_2x32_mib_reserves_192_native_and_180_expandable():
    h = History()
    xs = [h.alloc(16 * MiB) for _ in range(8)]
    for x in xs[1::2]:
        h.free(x)
    for _ in range(2):
        h.alloc(32 * MiB)
    assert peaks(h, NATIVE, EXPANDABLE) == [192 * MiB, 180 * MiB]


def test_of_two_equal_free_blocks_the_newer_segments_is_reused_as_the_driver_places_it_lower():
    # Two free 100 MiB blocks: the whole of an older 100 MiB segment, and the rest of a newer
    # 140 MiB one that still holds a live 40 MiB tensor. The one at the lower address serves
    # the next 100 MiB request; on the H200 a new segment lies below the earlier ones (95% of
    # pairs in the validation runs), so the older segment stays whole and empty_cache frees it.
    h = History()
    older = h.alloc(100 * MiB)
    newer = h.alloc(140 * MiB)
    h.free(newer)
    h.alloc(40 * MiB)  # the rest of the newer segment, 100 MiB, is now a split free block
    h.free(older)
    h.alloc(100 * MiB)
    h.empty_cache(100 * MiB)
    r, = w.whatif(h.snapshot(), [NATIVE])
    assert (r.peak_reserved_bytes, r.end_reserved_bytes) == (240 * MiB, 140 * MiB)


def _h200_recorded() -> dict:
    import gzip
    import json
    import os

    path = os.path.join(os.path.dirname(__file__), "data", "whatif_h200.json.gz")
    with gzip.open(path, "rt") as f:
        return json.load(f)


@pytest.mark.parametrize("workload", ["fragmenter", "gpt2_train"])
def test_replays_of_h200_histories_match_the_real_allocator_to_the_byte(workload):
    # Recorded once under the defaults on the H200, then run again under each setting: the
    # replay of the one history must give each run's peak, end and cudaMalloc/cudaFree counts,
    # and its OOM call under a memory fraction. With increasing made-up addresses, the
    # fragmenter's peaks came out up to 212 MiB low and gpt2_train's counts wrong.
    data = _h200_recorded()["workloads"][workload]
    runs = data["runs"]

    def setting(run):
        if run["fraction"] is None:
            return run["setting"]
        return w.with_setting(run["setting"], "per_process_memory_fraction",
                              repr(run["fraction"]))

    rows = w.whatif(data["trace"], [setting(r) for r in runs])
    got, want = [], []
    for run, row in zip(runs, rows, strict=True):
        if run["kind"] == "real":
            got.append((run["setting"], row.peak_reserved_bytes, row.end_reserved_bytes,
                        row.segment_allocs, row.segment_frees))
            want.append((run["setting"], run["peak_reserved_bytes"], run["end_reserved_bytes"],
                         run["num_device_alloc"], run["num_device_free"]))
        else:
            got.append((run["setting"], "oom", bool(row.oom)))
            want.append((run["setting"], "oom", run["oom"]))
    assert got == want
    assert {r["kind"] for r in runs} == {"real", "oom"} and len(runs) == 13


def test_roundup_power2_divisions_tables_are_the_ones_torch_2_11_parsed():
    # allocator_settings of the H200 runs: torch's own table for each form.
    assert parse_settings("roundup_power2_divisions:[32:4,>:2]").roundup_power2_divisions \
        == (4,) * 6 + (2,) * 10  # 32 MiB is interval 5; '>' starts after it
    assert parse_settings("roundup_power2_divisions:4").roundup_power2_divisions == (4,) * 16


# ------------------------------------------------------------------------------------------
# The sizing rules.
# ------------------------------------------------------------------------------------------
def test_sizes_round_to_512_bytes_and_small_requests_get_2_mib_segments():
    table = (0,) * 16
    assert round_size(1, table) == 512 and round_size(513, table) == 1024
    assert get_allocation_size(4, 20 * MiB) == kSmallBuffer
    assert get_allocation_size(MiB, 20 * MiB) == kSmallBuffer  # 1 MiB is still small
    assert get_allocation_size(MiB + 512, 20 * MiB) == 20 * MiB  # 1-10 MiB: a 20 MiB segment
    assert get_allocation_size(10 * MiB, 20 * MiB) == 10 * MiB  # from 10 MiB: 2 MiB steps
    assert get_allocation_size(11 * MiB, 20 * MiB) == 12 * MiB


def test_a_4_byte_tensor_reserves_2_mib_and_a_5_mib_one_20_mib():
    h = History()
    h.alloc(4)
    h.alloc(5 * MiB)
    assert peaks(h, NATIVE, EXPANDABLE) == [22 * MiB, 22 * MiB]


def test_roundup_power2_divisions_both_forms():
    four = parse_settings("roundup_power2_divisions:4").roundup_power2_divisions
    assert set(four) == {4}
    # 5 MiB + 1 lies in [4 MiB, 8 MiB): quarters of 1 MiB, so 6 MiB.
    assert round_size(5 * MiB + 1, four) == 6 * MiB
    assert round_size(4 * MiB, four) == 4 * MiB  # a power of two stays
    table = parse_settings("roundup_power2_divisions:[256:1,512:2,>:4]").roundup_power2_divisions
    assert table[:9] == (1,) * 9  # the first value also covers everything below 256 MiB
    assert table[9] == 2 and table[10:] == (4,) * 6
    assert round_size(600 * MiB + 1, table) == 768 * MiB  # halves of [512, 1024) MiB
    assert round_size(3 * GiB, table) == 3 * GiB


def test_the_kSmallSize_rule_keeps_a_remainder_of_1_mib_or_less_in_the_block():
    assert should_split(20 * MiB, 19 * MiB - 512, small=False, expandable_active=False,
                        max_split_size=SIZE_MAX)  # 1 MiB + 512 B left: split
    assert not should_split(20 * MiB, 19 * MiB, small=False, expandable_active=False,
                            max_split_size=SIZE_MAX)  # exactly 1 MiB left: not split
    assert should_split(2 * MiB, 2 * MiB - 512, small=True, expandable_active=False,
                        max_split_size=SIZE_MAX)  # small pool: 512 B is enough


def test_max_split_size_keeps_oversize_blocks_whole_and_away_from_smaller_requests():
    h = History()
    big = h.alloc(600 * MiB)
    h.free(big)
    h.alloc(100 * MiB)
    # Defaults: the 600 MiB block is split for 100 MiB. 512 MiB cap: it is oversize, so the
    # 100 MiB request gets a segment of its own.
    assert peaks(h, NATIVE, "max_split_size_mb:512") == [600 * MiB, 700 * MiB]


def test_an_oversize_block_serves_a_request_within_max_non_split_rounding_only():
    near, far = History(), History()
    for h, size in ((near, 590 * MiB), (far, 560 * MiB)):
        h.free(h.alloc(600 * MiB))
        h.alloc(size)
    assert peaks(near, "max_split_size_mb:512") == [600 * MiB]  # within 20 MiB: reused whole
    assert peaks(far, "max_split_size_mb:512") == [1160 * MiB]
    assert peaks(far, "max_split_size_mb:512,max_non_split_rounding_mb:64") == [600 * MiB]


def test_garbage_collection_acts_only_under_a_memory_fraction():
    h = History()
    h.free(h.alloc(300 * MiB))
    h.free(h.alloc(400 * MiB))
    h.alloc(500 * MiB)
    gpu = {"total_bytes": 2000 * MiB, "free_bytes": 2000 * MiB}
    start = {"segments": [], "devices": {"0": gpu}}
    r = w.whatif(h.snapshot(start=start), [
        "", "garbage_collection_threshold:0.5",
        "per_process_memory_fraction:0.5",
        "garbage_collection_threshold:0.5,per_process_memory_fraction:0.5"])
    plain, gc_alone, fraction, gc = r
    assert plain.peak_reserved_bytes == gc_alone.peak_reserved_bytes == 1200 * MiB
    assert "only under a memory fraction" in gc_alone.note
    # 1000 MiB allowed: 700 + 500 does not fit, so every free segment is released first.
    assert (fraction.peak_reserved_bytes, fraction.end_reserved_bytes) == (700 * MiB, 500 * MiB)
    assert not fraction.oom
    # GC at 500 MiB frees the block unused longest (the 300 MiB one), then cudaMalloc fits.
    assert (gc.peak_reserved_bytes, gc.end_reserved_bytes) == (900 * MiB, 900 * MiB)
    assert gc.segment_frees == 1 and fraction.segment_frees == 2


def test_cached_blocks_are_freed_and_the_request_retried_before_an_oom():
    h = History()
    for _ in range(4):
        h.free(h.alloc(200 * MiB))
    h.alloc(500 * MiB)
    fits, = w.whatif(h.snapshot(), [""], capacity_bytes=600 * MiB)
    assert not fits.oom and fits.peak_reserved_bytes == 500 * MiB  # 800 cached, released
    h.alloc(200 * MiB)
    over, = w.whatif(h.snapshot(), [""], capacity_bytes=600 * MiB)
    assert over.oom and over.oom_requested_bytes == 200 * MiB


def test_a_block_freed_on_another_stream_waits_for_its_event_before_reuse():
    waiting, done = History(), History()
    for h, completed in ((waiting, False), (done, True)):
        x = h.alloc(100 * MiB)
        h.free(x, completed=completed)
        h.alloc(100 * MiB)
        if not completed:
            h.complete(x)
    assert peaks(waiting, NATIVE) == [200 * MiB]
    assert peaks(done, NATIVE) == [100 * MiB]


def test_each_stream_has_its_own_pool():
    h = History()
    h.free(h.alloc(100 * MiB, stream=0))
    h.alloc(100 * MiB, stream=7)
    assert peaks(h, NATIVE, EXPANDABLE) == [200 * MiB, 200 * MiB]


def test_expandable_segments_map_20_mib_pages_and_2_mib_for_the_small_pool():
    h = History()
    for _ in range(3):
        h.alloc(700 * 1024)  # small pool: 2.1 MiB in 2 MiB pages
    h.alloc(30 * MiB)  # large pool: 20 MiB pages
    r, = w.whatif(h.snapshot(), [EXPANDABLE])
    assert r.peak_reserved_bytes == 4 * MiB + 40 * MiB
    assert r.segment_allocs == 3  # one map per growth: two small ones, one of two pages


def test_a_free_next_to_an_unmapped_hole_makes_room_the_next_request_finds():
    # Four 20 MiB pages, the second freed and unmapped: a hole. A 40 MiB request passes it
    # (20 MiB of room) and maps the tail; once the first page is freed too, the hole and it
    # hold the next 40 MiB request, which maps one page (120 MiB), not two at the tail.
    h = History(EXPANDABLE)
    a, b, _, _ = (h.alloc(20 * MiB) for _ in range(4))
    h.free(b)
    h.empty_cache(20 * MiB)
    h.alloc(40 * MiB)
    h.free(a)
    h.alloc(40 * MiB)
    r, = w.whatif(h.snapshot(), [EXPANDABLE])
    assert (r.peak_reserved_bytes, r.segment_allocs) == (120 * MiB, 6)


def test_an_unmap_that_takes_in_the_tail_keeps_its_room_where_the_next_search_looks():
    # 300 MiB at a 300 MiB capacity: the first try finds room at the tail (40 MiB in) and
    # fails to map it; the retry before the OOM unmaps the free page at 20 MiB, which takes
    # in the tail, so the room now starts lower. Remembering the tail's address made the
    # retry open a second segment: a third cudaFree when the cache is emptied.
    h = History(EXPANDABLE)
    a = h.alloc(33 * MiB)
    h.free(a)
    b, c = h.alloc(MiB + 1), h.alloc(300 * MiB)
    h.free(b)
    h.free(c)
    h.empty_cache(20 * MiB)
    r, = w.whatif(h.snapshot(), [EXPANDABLE], capacity_bytes=300 * MiB)
    assert (r.peak_reserved_bytes, r.end_reserved_bytes, r.segment_allocs, r.segment_frees,
            r.oom) == (320 * MiB, 0, 2, 2, True)


def test_empty_cache_with_a_live_tensor_unmaps_the_free_pages_of_an_expandable_segment():
    h = History()
    h.alloc(16 * MiB)
    b = h.alloc(100 * MiB)
    h.free(b)
    h.empty_cache(100 * MiB)  # recorded as a segment free no cudaMalloc follows
    native, expandable = w.whatif(h.snapshot(), [NATIVE, EXPANDABLE])
    assert native.end_reserved_bytes == 16 * MiB
    # One segment [0, 120) MiB; the tensor holds the first page, the rest is unmapped.
    assert expandable.end_reserved_bytes == 20 * MiB
    assert expandable.peak_reserved_bytes == 120 * MiB


def test_a_segment_free_before_a_cudamalloc_is_the_allocator_not_the_user():
    entries = [{"action": "segment_free", "addr": 1, "size": 2 * MiB},
               {"action": "segment_alloc", "addr": 2, "size": 20 * MiB},
               {"action": "alloc", "addr": 2, "size": 20 * MiB},
               {"action": "segment_free", "addr": 3, "size": 2 * MiB}]
    codes = [e[0] for e in compile_trace(entries).events]
    assert codes.count(EMPTY_CACHE) == 1 and codes[-1] == EMPTY_CACHE


def test_the_history_starts_from_the_segments_that_existed():
    h = History()
    old = 0x5000_0000
    h.alloc(50 * MiB)
    h.entries.append({"action": "free_requested", "addr": old, "size": 40 * MiB, "stream": 0})
    h.entries.append({"action": "free_completed", "addr": old, "size": 40 * MiB, "stream": 0})
    seg = {"device": 0, "address": old, "total_size": 100 * MiB, "stream": 0,
           "segment_type": "large", "blocks": [
               {"address": old, "size": 40 * MiB, "state": "active_allocated"},
               {"address": old + 40 * MiB, "size": 60 * MiB, "state": "inactive"}]}
    with_start = w.whatif(h.snapshot(start={"segments": [seg]}), [NATIVE])
    assert with_start[0].peak_reserved_bytes == 100 * MiB  # 50 MiB fits in the free 60
    assert with_start[0].start_reserved_bytes == 100 * MiB
    assert with_start.unmatched_frees == 0
    empty = w.whatif(h.snapshot(start={"segments": []}), [NATIVE])
    assert empty[0].peak_reserved_bytes == 50 * MiB and empty.unmatched_frees == 1


def test_a_dump_snapshot_without_a_start_record_rebuilds_the_segments_the_history_did_not_make():
    h = History()
    old = 0x5000_0000
    h.alloc(50 * MiB)
    end_segments = [{"device": 0, "address": old, "total_size": 100 * MiB, "stream": 0,
                     "segment_type": "large", "blocks": [
                         {"address": old, "size": 40 * MiB, "state": "active_allocated"},
                         {"address": old + 40 * MiB, "size": 60 * MiB, "state": "inactive"}]}]
    r = w.whatif(h.snapshot(segments=end_segments, recorded_start=False), [NATIVE])
    assert r[0].start_reserved_bytes == 100 * MiB and r[0].peak_reserved_bytes == 100 * MiB
    assert any("rebuilt" in n for n in r.notes)


def _segment(addr: int, *blocks: tuple[int, str], expandable: bool = False) -> dict:
    """A snapshot segment of ``blocks`` (size, state) laid out from ``addr``."""
    out, at = [], addr
    for size, state in blocks:
        out.append({"address": at, "size": size, "state": state})
        at += size
    return {"device": 0, "address": addr, "total_size": at - addr, "stream": 0,
            "segment_type": "large", "is_expandable": expandable, "blocks": out}


@pytest.mark.parametrize("setting", [NATIVE, EXPANDABLE])
def test_a_rebuilt_start_gives_back_as_free_what_the_history_allocated_in_an_old_segment(setting):
    # _dump_snapshot's pickle: one 20 MiB segment older than the history, whose first 5 MiB
    # the history allocated last. When the history began the whole segment was free, so its
    # 18 MiB request fits: no cudaMalloc. Left as two free blocks side by side, the rebuilt
    # start needed a second segment (38 MiB), and under expandable segments the model
    # asserted (a mapped block where it expected an unmapped one).
    h = History(setting)
    old = 0x7F10_0000_0000
    h.entries = [{"action": action, "addr": old, "size": size, "stream": 0}
                 for action, size in [("alloc", 18 * MiB), ("free_requested", 18 * MiB),
                                      ("free_completed", 18 * MiB), ("alloc", 5 * MiB)]]
    end = [_segment(old, (5 * MiB, "active_allocated"), (15 * MiB, "inactive"),
                    expandable=setting == EXPANDABLE)]
    r, = w.whatif(h.snapshot(segments=end, recorded_start=False), [setting])
    assert (r.start_reserved_bytes, r.peak_reserved_bytes, r.segment_allocs) == \
        (20 * MiB, 20 * MiB, 0)


def test_a_rebuilt_start_keeps_an_early_allocation_live_inside_a_free_block():
    # A 6 MiB tensor made before the history and freed in it lies inside the end snapshot's
    # free 20 MiB block: it was live when the history began, so the history's 16 MiB
    # request did not fit there (a second segment), and its free then makes room.
    h = History()
    old = 0x7F10_0000_0000
    h.alloc(16 * MiB)
    h.entries.append({"action": "free_requested", "addr": old + 4 * MiB, "size": 6 * MiB,
                      "stream": 0})
    h.entries.append({"action": "free_completed", "addr": old + 4 * MiB, "size": 6 * MiB,
                      "stream": 0})
    end = [_segment(old, (20 * MiB, "inactive"))]
    r = w.whatif(h.snapshot(segments=end, recorded_start=False), [NATIVE])
    assert r.unmatched_frees == 0
    assert (r[0].peak_reserved_bytes, r[0].segment_allocs) == (36 * MiB, 1)


def test_a_segment_freed_inside_an_end_snapshot_segment_is_not_loaded_over_it():
    # A history that frees a segment lying inside a segment of the end snapshot (a
    # snapshot of something else, or junk): two segments cannot overlap. Loading both made
    # the model's pools disagree with themselves (KeyError in release_blocks).
    h = History()
    old = 0x7F10_0000_0000
    h.alloc(30 * MiB)
    h.entries.append({"action": "segment_free", "addr": old + 2 * MiB, "size": 2 * MiB,
                      "stream": 0})
    end = [_segment(old, (20 * MiB, "inactive"))]
    r, = w.whatif(h.snapshot(segments=end, recorded_start=False), [NATIVE])
    assert r.start_reserved_bytes == 20 * MiB


def test_a_request_larger_than_an_expandable_segments_address_space_is_an_oom():
    # An expandable segment has address space for 9/8 of the GPU (80 GiB here): a 100 GiB
    # request cannot be mapped. After the predicted OOM the model forced the page map and
    # walked past the segment's end (AssertionError), for every expandable row.
    h = History()
    h.alloc(GiB)
    h.alloc(100 * GiB)
    start = {"segments": [], "devices": {"0": {"total_bytes": 80 * GiB, "free_bytes": 79 * GiB}}}
    rows = w.whatif(h.snapshot(start=start), [NATIVE, EXPANDABLE])
    assert [r.oom for r in rows] == [True, True]
    assert all(r.peak_reserved_bytes >= 101 * GiB for r in rows)
    # Without a capacity there is no OOM call, and still a prediction.
    h2 = History()
    h2.alloc(2 << 40)
    r, = w.whatif(h2.snapshot(), [EXPANDABLE])
    assert r.oom is None and r.peak_reserved_bytes >= 2 << 40


def _mss_split_start() -> tuple[History, dict]:
    # Recorded under the defaults: a 200 MiB segment split into a live 100 MiB tensor and a
    # free 100 MiB block. Under max_split_size_mb:64 a free block that large is oversize,
    # which PyTorch never splits, so release_block would cudaFree it: but only a whole
    # segment can be given back.
    h = History()
    old = 0x7F10_0000_0000
    h.alloc(150 * MiB)
    seg = _segment(old, (100 * MiB, "active_allocated"), (100 * MiB, "inactive"))
    start = {"segments": [seg], "devices": {"0": {"total_bytes": 80 * GiB,
                                                  "free_bytes": 100 * MiB}}}
    return h, start


def test_a_split_oversize_block_of_another_settings_start_is_never_given_back():
    h, start = _mss_split_start()
    rows = w.whatif(h.snapshot(start=start), [NATIVE, "max_split_size_mb:64"])
    # 200 MiB held + 150 MiB new in the 300 MiB PyTorch could use: an OOM under both. The
    # model used to free the split block and predict the 150 MiB fits (250 MiB, one cudaFree).
    assert [(r.peak_reserved_bytes, r.segment_frees, r.oom) for r in rows] == \
        [(350 * MiB, 0, True), (350 * MiB, 0, True)]


def test_freeing_next_to_a_split_oversize_block_keeps_the_allocator_consistent():
    h, start = _mss_split_start()
    h.entries.append({"action": "free_requested", "addr": 0x7F10_0000_0000,
                      "size": 100 * MiB, "stream": 0})
    h.entries.append({"action": "free_completed", "addr": 0x7F10_0000_0000,
                      "size": 100 * MiB, "stream": 0})
    ti = w.trace_input(h.snapshot(start=start))
    r = replay(compile_trace(ti.entries), parse_settings("max_split_size_mb:64"),
               limits=Limits(capacity_bytes=ti.capacity_bytes), start_segments=ti.start.segments,
               device_total_bytes=80 * GiB, on_event=check_invariants)  # used to IndexError
    assert (r.peak_reserved_bytes, r.end_reserved_bytes, r.unmatched_frees) == \
        (350 * MiB, 350 * MiB, 0)


def test_malformed_entries_are_skipped_and_counted():
    h = History()
    h.alloc(16 * MiB)
    h.entries[1:1] = [None, {"action": "alloc"}, {"action": "alloc", "addr": "x", "size": 5},
                      {"action": "free_requested", "addr": 1, "size": -3},
                      {"action": "teleport", "addr": 1, "size": 1}, "junk"]
    r = w.whatif(h.snapshot(), [NATIVE])
    assert r[0].peak_reserved_bytes == 16 * MiB
    assert sum(r.skipped.values()) == 6
    assert r.skipped["not a history entry"] == 2
    assert r.skipped["alloc without a valid address and size"] == 2
    assert any("teleport" in k for k in r.skipped)
    assert any("Skipped malformed" in n for n in r.notes)


def test_rows_come_in_the_order_given_and_async_is_not_guessed():
    h = History()
    h.alloc(16 * MiB)
    r = w.whatif(h.snapshot(), [EXPANDABLE, "backend:cudaMallocAsync", NATIVE])
    assert [x.label for x in r] == [EXPANDABLE, "backend:cudaMallocAsync", "defaults"]
    assert r[1].peak_reserved_bytes is None and not r[1].modelled
    assert "cannot be modelled" in r[1].note
    assert r[2].current and not r[0].current


@pytest.mark.parametrize(("text", "words"), [
    ("bogus:1", "not an allocator setting"),
    ("max_split_size_mb:10", "at least 20"),
    ("garbage_collection_threshold:1.5", "between 0 and 1"),
    ("roundup_power2_divisions:3", "power of two"),
    ("expandable_segments:Yes", "True or False"),
    ("expandable_segments", "ends too early"),
    ("backend:magic", "native or cudaMallocAsync"),
])
def test_a_setting_pytorch_would_refuse_is_refused_with_a_sentence(text, words):
    with pytest.raises(SettingError, match=words):
        parse_settings(text)


def test_snapshot_pickles_load_but_cannot_run_code(tmp_path):
    h = History()
    h.alloc(16 * MiB)
    good = tmp_path / "snap.pickle"
    good.write_bytes(pickle.dumps(h.snapshot(), protocol=4))
    assert w.whatif(str(good), [NATIVE])[0].peak_reserved_bytes == 16 * MiB

    class Evil:
        def __reduce__(self):
            return (print, ("ran code",))

    bad = tmp_path / "evil.pickle"
    bad.write_bytes(pickle.dumps({"segments": [], "device_traces": [Evil()]}))
    with pytest.raises(w.SnapshotError, match="plain data only"):
        w.whatif(str(bad), [NATIVE])
    with pytest.raises(w.SnapshotError, match="cannot read"):
        w.whatif(str(tmp_path / "missing.pickle"), [NATIVE])


def test_with_setting_replaces_one_key_and_keeps_brackets():
    assert w.with_setting("", "expandable_segments", "True") == "expandable_segments:True"
    assert w.with_setting("expandable_segments:False,roundup_power2_divisions:[256:1,>:4]",
                          "expandable_segments", "True") == \
        "roundup_power2_divisions:[256:1,>:4],expandable_segments:True"


# ------------------------------------------------------------------------------------------
# Invariants, on random histories under random settings.
# ------------------------------------------------------------------------------------------
SIZES = st.sampled_from([4, 512, 700 * 1024, MiB, MiB + 1, 3 * MiB, 9 * MiB, 10 * MiB,
                         17 * MiB, 33 * MiB, 100 * MiB, 300 * MiB])
SETTINGS = st.sampled_from([
    "", EXPANDABLE, "max_split_size_mb:64", "roundup_power2_divisions:4",
    "roundup_power2_divisions:[16:2,>:8]", "max_split_size_mb:32,expandable_segments:True",
    "garbage_collection_threshold:0.6,per_process_memory_fraction:0.5"])


@st.composite
def histories(draw: st.DrawFn) -> tuple[History, int]:
    h = History()
    live: list[tuple[int, int]] = []
    waiting: list[tuple[int, int]] = []
    orphans = 0
    for _ in range(draw(st.integers(1, 60))):
        op = draw(st.sampled_from(["alloc", "alloc", "free", "defer", "complete", "orphan",
                                   "empty"]))
        if op == "alloc" or (not live and op in ("free", "defer")):
            stream = draw(st.sampled_from([0, 0, 5]))
            live.append((h.alloc(draw(SIZES), stream), stream))
        elif op in ("free", "defer"):
            addr, stream = live.pop(draw(st.integers(0, len(live) - 1)))
            h.free(addr, stream, completed=op == "free")
            if op == "defer":
                waiting.append((addr, stream))
        elif op == "complete" and waiting:
            h.complete(*waiting.pop(0))
        elif op == "orphan":  # a free of something allocated before the history
            h.entries.append({"action": "free_requested", "addr": 0x10 + orphans, "size": 512,
                              "stream": 0})
            orphans += 1
        elif op == "empty":
            h.empty_cache(MiB)
    for addr, stream in waiting:
        h.complete(addr, stream)
    return h, orphans


def check_invariants(i, model, live):
    assert model.allocated <= model.reserved
    assert model.allocated == sum(b.size for b in live.values())
    assert all(b.allocated for b in live.values())
    mapped = 0
    spans = []
    for chain in model.segments(live.values()):
        for a, b in pairwise(chain):
            assert a.ptr + a.size == b.ptr, "blocks of a segment must tile it"
            assert a.next is b and b.prev is a
        mapped += sum(b.size for b in chain if b.mapped)
        spans += [(b.ptr, b.ptr + b.size) for b in chain if b.allocated]
    assert mapped == model.reserved
    spans.sort()
    for (_, end), (start, _) in pairwise(spans):
        assert end <= start, "two live blocks overlap"
    for pool in model.pools.values():
        assert pool.keys == sorted(pool.keys) and len(pool.keys) == len(pool.blocks)
        assert all(not b.allocated and not b.pending and b.mapped for b in pool.blocks.values())
        assert pool.releasable == {k for k, b in pool.blocks.items() if b.nonrel < b.size}


@settings(max_examples=150, deadline=None)
@given(histories(), SETTINGS, st.sampled_from([None, 150 * MiB, 600 * MiB]))
def test_any_history_keeps_the_allocator_invariants(history, setting, capacity):
    h, orphans = history
    trace = compile_trace(h.entries)
    s = parse_settings(setting)
    allowed = int(0.5 * 2 * GiB) if s.per_process_memory_fraction else None
    r = replay(trace, s, limits=Limits(allowed_bytes=allowed, capacity_bytes=capacity),
               device_total_bytes=2 * GiB, on_event=check_invariants)
    assert r.unmatched_frees == orphans  # every other free matched its allocation
    assert r.peak_reserved_bytes >= r.end_reserved_bytes >= 0
    if capacity is None and allowed is None:
        assert r.oom is None


@st.composite
def start_states(draw: st.DrawFn) -> tuple[list[dict], list[int]]:
    """Segments as a snapshot recorded under some other setting may list them (split
    oversize blocks, free blocks side by side, expandable ranges) and the addresses of their
    live blocks, which the history may free."""
    segments, live = [], []
    for k in range(draw(st.integers(0, 4))):
        base = 0x7F10_0000_0000 + k * GiB
        expandable = draw(st.booleans())
        unit = 20 * MiB if expandable else 512
        blocks = []
        for _ in range(draw(st.integers(1, 5))):
            size = draw(st.sampled_from([1, 2, 5, 100]) if expandable else SIZES) * (
                unit if expandable else 1)
            blocks.append((-(-size // 512) * 512, draw(st.sampled_from(
                ["active_allocated", "inactive", "inactive", "active_pending_free"]))))
        seg = _segment(base, *blocks, expandable=expandable)
        if expandable and seg["total_size"] % (20 * MiB):
            seg["blocks"].append({"address": base + seg["total_size"], "state": "inactive",
                                  "size": -seg["total_size"] % (20 * MiB)})
            seg["total_size"] += seg["blocks"][-1]["size"]
        segments.append(seg)
        live += [b["address"] for b in seg["blocks"] if b["state"] == "active_allocated"]
    return segments, live


@settings(max_examples=200, deadline=None)
@given(start_states(), histories(), SETTINGS, st.sampled_from([None, 600 * MiB, 4 * GiB]),
       st.booleans(), st.data())
def test_any_start_state_keeps_the_allocator_invariants(start, history, setting, capacity,
                                                        recorded, data):
    # The crashes came from start states no allocator of the replayed setting would make:
    # oversize blocks split, free blocks side by side; recorded by %%gpumem --trace, or
    # rebuilt from a _dump_snapshot pickle's end snapshot (the same segments, read as the
    # state at the end).
    segments, live = start
    h, _ = history
    h.alloc(MiB)
    for addr in data.draw(st.lists(st.sampled_from(live), unique=True)) if live else ():
        h.entries.insert(data.draw(st.integers(0, len(h.entries))),
                         {"action": "free_requested", "addr": addr, "size": 512, "stream": 0})
    ti = w.trace_input(h.snapshot(start={"segments": segments}) if recorded else
                       h.snapshot(segments=segments, recorded_start=False))
    s = parse_settings(setting)
    allowed = int(0.5 * 8 * GiB) if s.per_process_memory_fraction else None
    r = replay(compile_trace(ti.entries), s,
               limits=Limits(allowed_bytes=allowed, capacity_bytes=capacity),
               start_segments=ti.start.segments, device_total_bytes=8 * GiB,
               on_event=check_invariants)
    assert r.peak_reserved_bytes >= r.end_reserved_bytes >= 0


def test_an_expandable_start_segment_never_grows_into_the_segment_listed_above_it():
    # Found by the test above: a 2 GiB expandable range with a 512 B segment 1 GiB past its
    # end; the replay grew the range over that segment's block (two live blocks overlapped).
    base = 0x7F10_0000_0000
    segments = [_segment(base, (20 * MiB, "active_allocated"), (2000 * MiB, "active_allocated"),
                         expandable=True),
                _segment(base + 2020 * MiB + GiB, (512, "active_allocated"))]
    h = History(setting=EXPANDABLE)
    h.alloc(2 * GiB)
    ti = w.trace_input(h.snapshot(start={"segments": segments}))
    r = replay(compile_trace(ti.entries), parse_settings(EXPANDABLE), limits=Limits(),
               start_segments=ti.start.segments, device_total_bytes=8 * GiB,
               on_event=check_invariants)
    assert r.peak_reserved_bytes >= 2020 * MiB + 512 + 2 * GiB


def test_a_snapshot_listing_a_segment_inside_an_expandable_range_is_loaded_as_ordinary():
    base = 0x7F10_0000_0000
    segments = [_segment(base, (20 * MiB, "active_allocated"), expandable=True),
                _segment(base + 40 * MiB, (20 * MiB, "active_allocated"), expandable=True),
                _segment(base + 20 * MiB, (512, "active_allocated"))]
    h = History(setting=EXPANDABLE)
    h.alloc(20 * MiB)  # what the unmapped gap would take, over the 512 B segment
    ti = w.trace_input(h.snapshot(start={"segments": segments}))
    r = replay(compile_trace(ti.entries), parse_settings(EXPANDABLE), limits=Limits(),
               start_segments=ti.start.segments, device_total_bytes=8 * GiB,
               on_event=check_invariants)
    assert r.start_reserved_bytes == 40 * MiB + 512


@st.composite
def holey_histories(draw: st.DrawFn) -> History:
    """Tensors, some freed, the cache emptied (unmapped holes between live pages), then
    more requests: where the remembered lowest room matters."""
    h = History()
    big = st.sampled_from([MiB // 2, 3 * MiB, 20 * MiB, 30 * MiB, 40 * MiB, 60 * MiB])
    xs = [h.alloc(draw(big), draw(st.sampled_from([0, 0, 5]))) for _ in range(
        draw(st.integers(2, 25)))]
    for x in draw(st.lists(st.sampled_from(xs), unique=True)):
        h.free(x)
        xs.remove(x)
    h.empty_cache(20 * MiB)
    for _ in range(draw(st.integers(1, 30))):
        if xs and draw(st.integers(0, 5)) == 0:
            h.free(xs.pop(draw(st.integers(0, len(xs) - 1))))
        else:
            xs.append(h.alloc(draw(big)))
    return h


@settings(max_examples=150, deadline=None)
@given(st.one_of(holey_histories(), histories().map(lambda hx: hx[0])),
       st.sampled_from([EXPANDABLE, "expandable_segments:True,max_split_size_mb:32",
                        "expandable_segments:True,roundup_power2_divisions:4"]),
       st.sampled_from([None, 300 * MiB]))
def test_the_remembered_lowest_room_finds_the_block_a_full_scan_finds(h, setting, capacity):
    # find_expandable_block starts where the last scan found room (a history with many
    # unmapped holes was quadratic); PyTorch scans from the lowest address each time.
    from gpumem_nb.whatif.allocator import DeviceCachingAllocator

    trace, s = compile_trace(h.entries), parse_settings(setting)
    runs = []
    for hint in (True, False):
        DeviceCachingAllocator.use_room_hint = hint
        try:
            r = replay(trace, s, limits=Limits(capacity_bytes=capacity),
                       device_total_bytes=2 * GiB)
        finally:
            DeviceCachingAllocator.use_room_hint = True
        runs.append((r.changes, r.segment_allocs, r.segment_frees, r.oom_event))
    assert runs[0] == runs[1]


def test_a_compact_trace_without_stacks_replays_like_the_full_snapshot(tmp_path):
    import gzip
    import json

    from gpumem_nb.whatif.snapshot import compact

    h = History()
    xs = [h.alloc(16 * MiB) for _ in range(8)]
    for x in xs[1::2]:
        h.free(x)
    h.alloc(32 * MiB)
    for e in h.entries:
        e["frames"] = [{"filename": "cell.py", "line": 1, "name": "<module>"}]
    full = h.snapshot()
    path = tmp_path / "trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(compact(full), f)
    with gzip.open(path, "rt") as f:
        assert "frames" not in f.read()
    a = w.whatif(full, [NATIVE, EXPANDABLE])
    b = w.whatif(str(path), [NATIVE, EXPANDABLE])
    assert [r.peak_reserved_bytes for r in a] == [r.peak_reserved_bytes for r in b] == \
        [160 * MiB, 160 * MiB]


def test_an_empty_cache_right_before_a_cudamalloc_with_room_to_spare_is_the_users():
    # The H200 session: empty_cache(), then a request the emptied cache could not serve.
    # Its segment frees come right before a cudaMalloc, as the allocator's own do when it
    # makes room; with 10 GiB free there was no room to make, so they were the user's.
    entries = [{"action": "segment_alloc", "addr": 1, "size": 100 * MiB},
               {"action": "alloc", "addr": 1, "size": 100 * MiB},
               {"action": "free_requested", "addr": 1, "size": 100 * MiB},
               {"action": "free_completed", "addr": 1, "size": 100 * MiB},
               {"action": "segment_free", "addr": 1, "size": 100 * MiB},
               {"action": "segment_alloc", "addr": 2, "size": 200 * MiB},
               {"action": "alloc", "addr": 2, "size": 200 * MiB}]
    snap = {"device_traces": [entries], "segments": [],
            "gpumem_start": {"segments": [], "devices": {"0": {
                "free_bytes": 10 * GiB, "total_bytes": 141 * GiB}}}}
    r, = w.whatif(snap, [NATIVE])
    assert r.peak_reserved_bytes == 200 * MiB  # emptied first: never 300 MiB at once
    # At a 250 MiB cap the same frees are the allocator's: nothing is emptied by the user
    # (the model frees the cached 100 MiB itself to fit the 200).
    snap["gpumem_start"]["devices"]["0"]["free_bytes"] = 250 * MiB
    codes = [e[0] for e in compile_trace(entries, start_reserved_bytes=0,
                                         recorded_limit_bytes=250 * MiB).events]
    assert EMPTY_CACHE not in codes
