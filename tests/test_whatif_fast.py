"""The what-if made fast (issue 37) replays exactly as before: every field of each replay of
``tests/whatif_expected.py``'s varied histories (training loops with a side stream and
``empty_cache``, random sizes, ``torch.cat`` growth; seven settings; unlimited and capped,
through the free-the-cache-and-retry path) equals what the model gave before the change,
stored in ``tests/data/whatif_expected_replays.json`` by the old code."""

from __future__ import annotations

import json

import pytest

from .whatif_expected import DATA, histories, replay_case

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
