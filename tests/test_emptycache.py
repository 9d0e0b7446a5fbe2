"""What ``%gpumem cleanup --dry-run`` and the OOM explainer say empty_cache would give back.

On the H200, 20 free 1 GiB holes in a 40 GiB segment that still held tensors were promised
as "up to 20.00 GiB of cached blocks (empty_cache)"; empty_cache gave back nothing, because
the native allocator frees only segments with nothing in them. Each backend's rule is in
``gpumem_nb/emptycache.py``; these tests hold each one, table-driven, then through the magic.
"""

from __future__ import annotations

from typing import Any

from gpumem_nb import emptycache
from gpumem_nb.emptycache import PAGES, PAGES_BOUND, POOL, SEGMENTS, STATS, estimate
from gpumem_nb.model import AllocatorReading

from .fakes import GiB, MiB
from .test_oom import last, world  # noqa: F401  (the OOM explainer's world, both backends)


def reading(allocated: int, reserved: int, inactive_split: int = 0) -> AllocatorReading:
    return AllocatorReading(allocated_bytes=allocated, reserved_bytes=reserved,
                            active_bytes=allocated, inactive_split_bytes=inactive_split,
                            peak_allocated_bytes=allocated, peak_reserved_bytes=reserved,
                            num_alloc_retries=0, num_ooms=0)


def block(address: int, size: int, state: str = "inactive") -> dict[str, Any]:
    return {"address": address, "size": size, "state": state}


def segment(address: int, blocks: list[dict[str, Any]], *, expandable: bool = False,
            kind: str = "large", device: int = 0, pool: tuple[int, int] = (0, 0),
            ) -> dict[str, Any]:
    return {"device": device, "address": address, "total_size": sum(b["size"] for b in blocks),
            "is_expandable": expandable, "segment_type": kind, "segment_pool_id": pool,
            "blocks": blocks}


BASE = 0x7F00_0000_0000


def holes_segment(*, expandable: bool = False) -> dict[str, Any]:
    """The H200's case: 40 GiB, a live 1 GiB tensor then a free 1 GiB hole, twenty times."""
    blocks = [block(BASE + k * GiB, GiB, "active_allocated" if k % 2 == 0 else "inactive")
              for k in range(40)]
    return segment(BASE, blocks, expandable=expandable)


# -- native -------------------------------------------------------------------------------------
def test_twenty_free_holes_in_a_segment_that_holds_tensors_return_nothing():
    h200 = {0: reading(20 * GiB, 40 * GiB, inactive_split=20 * GiB)}
    from_stats = estimate(h200, backend="native", expandable=False, segments=None)
    from_segments = estimate(h200, backend="native", expandable=False,
                             segments=[holes_segment()])
    for est in (from_stats, from_segments):
        assert est is not None and est.nbytes == 0 and est.kept_bytes == 20 * GiB
    assert from_stats.rule == STATS and from_segments.rule == SEGMENTS
    assert "20.00 GiB free inside segments that still hold tensors stays" in from_segments.did()


def test_only_segments_with_nothing_in_them_are_returned():
    segments = [
        holes_segment(),
        segment(BASE + 64 * GiB, [block(BASE + 64 * GiB, 3 * GiB)]),  # wholly free
        segment(BASE + 80 * GiB, [block(BASE + 80 * GiB, 2 * MiB)], kind="small"),
        # freed on another stream, waiting for its event: empty_cache syncs it first
        segment(BASE + 90 * GiB, [block(BASE + 90 * GiB, 40 * MiB, "active_pending_free")]),
        # a CUDA graph's private pool: freed only when its graph is gone
        segment(BASE + 96 * GiB, [block(BASE + 96 * GiB, GiB)], pool=(1, 0)),
        segment(BASE, [block(BASE, 5 * GiB)], device=1),  # another GPU, not asked about
    ]
    est = estimate({0: reading(20 * GiB, 64 * GiB + 40 * MiB + 2 * MiB, 20 * GiB)},
                   backend="native", expandable=False, segments=segments)
    assert est is not None
    assert est.nbytes == 3 * GiB + 2 * MiB + 40 * MiB and est.segments == 3
    assert est.exact and est.brief() == "3.04 GiB in wholly free cached segments (empty_cache)"


def test_the_stats_alone_give_reserved_minus_allocated_minus_inactive_split_at_most():
    est = estimate({0: reading(20 * GiB, 50 * GiB, 20 * GiB), 1: reading(0, 2 * GiB)},
                   backend="native", expandable=False, segments=None)
    assert est is not None and est.nbytes == 12 * GiB and not est.exact
    assert est.brief().startswith("up to 12.00 GiB")
    assert estimate({}, backend="native", expandable=False, segments=None) is None


# -- expandable segments ----------------------------------------------------------------------
def test_expandable_segments_give_back_the_whole_free_pages_inside_each_free_block():
    page = 20 * MiB
    # A 1 GiB hole from 1 GiB to 2 GiB: pages are counted from the segment's start, so the
    # hole holds pages 52 to 101 (51.2 pages' worth, 50 of them whole).
    one = segment(BASE, [block(BASE, GiB, "active_allocated"), block(BASE + GiB, GiB),
                         block(BASE + 2 * GiB, GiB, "active_allocated")], expandable=True)
    est = estimate({0: reading(2 * GiB, 3 * GiB)}, backend="native", expandable=True,
                   segments=[one])
    assert est is not None and est.rule == PAGES
    assert est.nbytes == 50 * page and est.kept_bytes == GiB - 50 * page
    # The small pool maps 2 MiB pages: a 5 MiB free run starting 1 MiB in holds two.
    small = segment(BASE, [block(BASE, MiB, "active_allocated"),
                           block(BASE + MiB, 3 * MiB), block(BASE + 4 * MiB, 2 * MiB),
                           block(BASE + 6 * MiB, MiB, "active_allocated")],
                    expandable=True, kind="small")
    est = estimate({0: reading(2 * MiB, 8 * MiB)}, backend="native", expandable=True,
                   segments=[small])
    assert est is not None and est.nbytes == 4 * MiB


def test_expandable_segments_return_most_of_the_h200s_holes():
    est = estimate({0: reading(20 * GiB, 40 * GiB)}, backend="native", expandable=True,
                   segments=[holes_segment(expandable=True)])
    assert est is not None
    # Each hole loses at most the two pages its ends cut: nearly all of it comes back.
    assert 20 * GiB - 20 * 2 * 20 * MiB <= est.nbytes < 20 * GiB
    assert est.nbytes % (20 * MiB) == 0


def test_a_large_segment_size_setting_changes_the_page():
    one = segment(BASE, [block(BASE, 64 * MiB), block(BASE + 64 * MiB, 8 * MiB,
                                                      "active_allocated")], expandable=True)
    est = estimate({0: reading(8 * MiB, 72 * MiB)}, backend="native", expandable=True,
                   segments=[one], large_page_bytes=32 * MiB)
    assert est is not None and est.nbytes == 64 * MiB


def test_expandable_segments_without_their_segments_give_only_a_bound():
    est = estimate({0: reading(20 * GiB, 40 * GiB)}, backend="native", expandable=True,
                   segments=None)
    assert est is not None and est.rule == PAGES_BOUND and not est.exact
    assert est.nbytes == 20 * GiB and "could not be read" in est.did()


# -- cudaMallocAsync ------------------------------------------------------------------------
def test_cudamallocasync_is_the_pools_trim_at_most_reserved_minus_allocated():
    est = estimate({0: reading(20 * GiB, 40 * GiB, inactive_split=0)},
                   backend="cudaMallocAsync", expandable=False, segments=[holes_segment()])
    assert est is not None and est.rule == POOL and est.nbytes == 20 * GiB
    assert "cudaMemPoolTrimTo" in est.did() and "trims" in est.brief()


# -- through the magic and the explainer ------------------------------------------------------


def dry_then_real(ip: Any) -> tuple[Any, Any]:
    dry = ip.run_line_magic("gpumem", "cleanup --dry-run -o")
    real = ip.run_line_magic("gpumem", "cleanup -o")
    step = "empty_cache"
    return (next(s for s in dry.steps if s.step == step),
            next(s for s in real.steps if s.step == step))


def test_the_dry_run_promises_nothing_for_holes_and_the_cleanup_frees_nothing(loaded, fake_gpu):
    d = fake_gpu.cuda.devices[0]
    d.allocated, d.reserved, d.inactive_split, d.free_pieces = 20 * GiB, 40 * GiB, 20 * GiB, [
        GiB] * 20
    fake_gpu.cuda._sync()
    dry, real = dry_then_real(loaded)
    assert dry.freed_reserved_bytes == 0, dry
    assert "20.00 GiB free inside segments that still hold tensors stays" in dry.did
    assert real.freed_reserved_bytes == 0  # what the dry run said


def test_the_dry_run_counts_a_wholly_free_cache_and_the_cleanup_frees_it(loaded, fake_gpu):
    loaded.run_cell("x = cuda.tensor(3 * GiB); del x", store_history=True)
    dry, real = dry_then_real(loaded)
    assert dry.freed_reserved_bytes == real.freed_reserved_bytes == 3 * GiB
    assert "memory_snapshot(include_traces=False)" in fake_gpu.cuda.calls  # read, not guessed


def test_the_dry_run_under_cudamallocasync_says_it_is_the_pools_trim(loaded, fake_gpu):
    fake_gpu.cuda.backend = "cudaMallocAsync"
    loaded.run_cell("x = cuda.tensor(3 * GiB); del x", store_history=True)
    dry, _ = dry_then_real(loaded)
    assert dry.freed_reserved_bytes == 3 * GiB and "cudaMallocAsync pool" in dry.did


def test_the_summary_says_how_much_of_the_cache_empty_cache_can_release(loaded, fake_gpu,
                                                                       capsys):
    d = fake_gpu.cuda.devices[0]
    d.reserved, d.allocated, d.inactive_split = 4 * GiB, GiB, 2 * GiB
    loaded.run_line_magic("gpumem", "summary")
    out = " ".join(capsys.readouterr().out.split())
    assert "3.00 GiB is cached but free" in out
    assert "empty_cache can release only 1.00 GiB of it" in out


def test_the_summary_never_says_only_x_of_x_when_empty_cache_keeps_next_to_nothing(
        loaded, fake_gpu, capsys):
    # H200, tutorial 04: "1.50 GiB is cached but free ... empty_cache can release only
    # 1.50 GiB of it: the rest lies in segments that still hold tensors" (896 KiB kept).
    d = fake_gpu.cuda.devices[0]
    d.reserved, d.allocated, d.inactive_split = 4 * GiB, GiB, 896 * 1024
    loaded.run_line_magic("gpumem", "summary")
    out = " ".join(capsys.readouterr().out.split())
    assert "3.00 GiB is cached but free" in out and "can release only" not in out


def test_the_summary_says_a_retry_is_no_oom_and_may_be_a_caps(loaded, fake_gpu, capsys):
    # The hint said "the allocator hit the device limit ... Retries mean you are close to an
    # OOM" where tutorial 04 had just shown retries against a memory fraction, with no OOM.
    fake_gpu.cuda.devices[0].retries = 3
    loaded.run_line_magic("gpumem", "summary")
    out = " ".join(capsys.readouterr().out.split())
    assert "3 time(s) the allocator could not get memory" in out
    assert "memory fraction's cap" in out and "A retry that then succeeds is no OOM" in out
    assert "device limit" not in out


def test_the_oom_explainer_never_promises_split_holes_to_empty_cache(world):  # noqa: F811
    d = world.cuda.devices[0]
    world.shell.run_cell("keep = cuda.tensor(70 * GiB)", store_history=True)
    d.inactive_split, d.free_pieces = 50 * GiB, [GiB] * 50
    d.reserved = d.allocated + d.inactive_split
    world.cuda._sync()
    world.shell.run_cell("y = cuda.tensor(25 * GiB)", store_history=True)
    text = str(last(world.shell))
    assert "of cached blocks" not in text
    if world.backend == "native":
        assert "empty_cache)" not in text, text  # nothing to promise: every hole is split
    else:  # the pool trims what it holds unused; the driver decides
        assert "up to 50.00 GiB unused in the cudaMallocAsync pool (empty_cache trims it)" in text


def test_the_stats_rule_never_goes_below_zero():
    assert emptycache.from_stats(reading(GiB, 3 * GiB, GiB)) == GiB
    # allocated and inactive_split read a moment apart can add up to more than reserved
    assert emptycache.from_stats(reading(2 * GiB, 3 * GiB, 2 * GiB)) == 0
