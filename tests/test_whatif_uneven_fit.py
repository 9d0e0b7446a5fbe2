"""A torch.cat growth history's fit is not monotonic in the room (issue 37, H100 at 4c59930:
`kv_cache_growth_by_cat` under the defaults was predicted to need 35.27 GB, and a real run
capped 2% under that fitted). The replay shows the same: under the bisection's minimum some
rooms fit and some run out. The fit goes on down until two rooms in a row run out, says
the smallest that fitted, and never moves its minimum (every room tried above it fits)."""

from __future__ import annotations

from gpumem_nb.whatif import api as w
from gpumem_nb.whatif.config import parse_settings
from gpumem_nb.whatif.fit import STEP_FRACTION, _room_limits
from gpumem_nb.whatif.replay import compile_trace, replay

from .whatif_expected import KV_TOTAL_BYTES as TOTAL_BYTES
from .whatif_expected import kv_cat_growth as kv_history
from .whatif_expected import training


def _fits(trace, room: int) -> bool:
    s = parse_settings("")
    return not replay(trace, s, limits=_room_limits(s, room), start_segments=[],
                      stop_at_oom=True, device_total_bytes=TOTAL_BYTES).oom


def test_a_cat_growth_fit_says_the_smaller_room_that_fits_below_its_minimum():
    h = kv_history()
    res = w.whatif(h.snapshot(), [""], fit=True, capacity_bytes=TOTAL_BYTES,
                   total_bytes=TOTAL_BYTES)
    row = res.fit.rows[0]
    assert row.min_bytes == 35_268_204_816  # what the H100 session's own fit said
    assert row.lowest_bytes is not None and row.lowest_bytes < row.min_bytes * 0.98
    trace = compile_trace(h.entries)
    assert _fits(trace, row.lowest_bytes)
    assert not all(_fits(trace, int(row.lowest_bytes + k * (row.min_bytes - row.lowest_bytes)
                                    / 6)) for k in range(1, 6))
    # A search step under the lowest runs out: where the search went on from.
    step = int(row.lowest_bytes * STEP_FRACTION)
    assert not _fits(trace, row.lowest_bytes - step)
    text = str(res)
    assert "also fits in" in text and "not in every room between" in text


def test_a_training_loops_fit_is_monotonic_and_says_no_smaller_room():
    res = w.whatif(training(3, 3000).snapshot(), ["", "expandable_segments:True"], fit=True)
    for row in res.fit.rows:
        assert row.min_bytes is not None and row.lowest_bytes is None
    assert "also fits in" not in str(res)


def test_a_memory_fraction_setting_looks_under_its_minimum_as_the_defaults_do():
    # The minimum of a fraction setting is a room (the cap divided by the fraction): it
    # is compared with the peak as the cap it allows, or the look under it never ran.
    h = kv_history()
    # At 0.4 the room (88 GB) is over the unlimited peak (85 GB); the cap it allows is not.
    res = w.whatif(h.snapshot(), ["", "per_process_memory_fraction:0.4"], fit=True,
                   capacity_bytes=TOTAL_BYTES, total_bytes=TOTAL_BYTES)
    plain, capped = res.fit.rows
    assert capped.min_bytes is not None and capped.min_bytes > TOTAL_BYTES
    assert abs(capped.min_bytes * 0.4 - plain.min_bytes) <= 0.01 * plain.min_bytes
    assert plain.lowest_bytes is not None and capped.lowest_bytes is not None


def test_under_a_memory_fraction_the_cap_not_the_room_is_weighed_against_the_peak():
    from gpumem_nb.whatif.fit import uneven_worth_trying

    peak = 85 * 10**9
    # A room of 88 GB under a 0.4 fraction allows 35.2 GB: well under the 85 GB peak.
    assert uneven_worth_trying(parse_settings("per_process_memory_fraction:0.4"),
                               88 * 10**9, peak)
    assert not uneven_worth_trying(parse_settings(""), 88 * 10**9, peak)
    assert not uneven_worth_trying(parse_settings(""), 80 * 10**9, peak)
    assert uneven_worth_trying(parse_settings(""), 70 * 10**9, peak)
