"""The what-if made fast (issue 37) replays exactly as before: every field of each replay of
``tests/whatif_expected.py``'s varied histories (training loops with a side stream and
``empty_cache``, random sizes, ``torch.cat`` growth; seven settings; unlimited and capped,
through the free-the-cache-and-retry path) equals what the model gave before the change,
stored in ``tests/data/whatif_expected_replays.json`` by the old code."""

from __future__ import annotations

import json
import time

import pytest

from gpumem_nb.whatif import api

from .helpers import hang_guard
from .whatif_expected import DATA, histories, replay_case
from .whatif_history import History

MiB = 1 << 20

_STORED = json.loads(DATA.read_text())["cases"]
_HISTORIES = histories()
_PEAKS = {(c["history"], c["setting"]): c["expected"]["peak_reserved_bytes"]
          for c in _STORED if c["cap_of_peak"] is None}


def test_the_stored_cases_cover_caps_retries_and_ooms():
    assert len(_STORED) >= 100
    assert any(c["expected"]["oom"] for c in _STORED)
    assert any(c["expected"]["num_alloc_retries"] for c in _STORED)
    assert any(c["expected"]["segment_frees"] for c in _STORED)


def _name(c: dict) -> str:
    return f"{c['history']}|{c['setting'] or 'defaults'}|{c['cap_of_peak']}"


@pytest.mark.parametrize("case", _STORED, ids=_name)
def test_the_fast_replay_gives_what_the_old_model_gave(case):
    got = replay_case(_HISTORIES[case["history"]], case["setting"], case["cap_of_peak"],
                      _PEAKS[(case["history"], case["setting"])])
    assert got == case["expected"]


def _session_snapshot(n_allocs: int) -> dict:
    from gpumem_nb.whatif.snapshot import SESSION_KEY

    h = History()
    for _ in range(n_allocs):
        h.free(h.alloc(5 * MiB))
    snap = h.snapshot()
    snap[SESSION_KEY] = {"since_us": 0.0, "dropped": 0, "max_entries": 1_000_000}
    return snap


def test_the_oom_line_of_a_long_session_is_left_out_in_a_sentence_that_says_how_to_get_it():
    # A session of 1,000,000 entries held each OOM cell 3.3 s for this line.
    big = _session_snapshot(api.OOM_LINE_MAX_ENTRIES // 3 + 1)
    t0 = time.perf_counter()
    line = api.expandable_oom_line(big, device=0, capacity_bytes=60 * MiB + 1)
    assert time.perf_counter() - t0 < hang_guard(0.05)
    assert line.startswith("The expandable_segments:True line is left out: the session "
                           "recording holds 15,003 allocator events")
    assert "%gpumem whatif --session --conf expandable_segments:True --capacity 61MiB " \
        "replays them" in line
    # Within the bound it is replayed; under expandable segments already, nothing is said.
    small = _session_snapshot(api.OOM_LINE_MAX_ENTRIES // 3 - 1)
    assert "from the start of the session recording" in api.expandable_oom_line(
        small, device=0, capacity_bytes=60 * MiB)
    big["allocator_settings"] = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert api.expandable_oom_line(big, device=0, capacity_bytes=60 * MiB) == ""


@pytest.mark.parametrize("setting", ("", "expandable_segments:True",
                                     "garbage_collection_threshold:0.6"))
def test_a_finished_replay_leaves_the_cycle_collector_nothing_to_free(setting):
    # As cycles, a million-entry replay's blocks cost the collector 0.5 s after it.
    import gc

    from gpumem_nb.whatif.allocator import Limits
    from gpumem_nb.whatif.config import parse_settings
    from gpumem_nb.whatif.replay import compile_trace, replay

    from .test_whatif_frozen import mixed

    h, segments = mixed(1)
    trace = compile_trace(h.entries)
    gc.collect()
    gc.disable()  # else the collector, enabled again, may free them before it is asked
    try:
        r = replay(trace, parse_settings(setting), start_segments=segments,
                   limits=Limits(allowed_bytes=12 << 30, capacity_bytes=12 << 30))
        left = gc.collect()
    finally:
        gc.enable()
    assert r.segment_allocs and r.peak_reserved_bytes
    assert left == 0
