"""The rules a flag's value must follow live in the domain, not in the magic that reads the
flag: a notebook that calls the API gets the same answer as `%gpumem` does."""

from __future__ import annotations

from types import SimpleNamespace

from gpumem_nb.session import max_entries_refusal
from gpumem_nb.whatif import api as wi
from gpumem_nb.whatif.snapshot import MAX_HISTORY_ENTRIES


def test_a_gpu_size_given_without_its_unit_is_no_gpu():
    assert not wi.plausible_gpu_bytes(80)
    assert wi.plausible_gpu_bytes(80 << 30)


def test_a_recording_longer_than_the_session_replay_reads_is_refused_by_the_recorder_rule():
    idle = SimpleNamespace(active=False, max_entries=100_000)
    assert max_entries_refusal(None, idle, True) == ""  # type: ignore[arg-type]
    assert max_entries_refusal(MAX_HISTORY_ENTRIES, idle, True) == ""  # type: ignore[arg-type]
    assert "between 1 and" in max_entries_refusal(MAX_HISTORY_ENTRIES + 1, idle, True)  # type: ignore[arg-type]
    assert "between 1 and" in max_entries_refusal(0, idle, True)  # type: ignore[arg-type]


def test_a_recording_already_on_keeps_its_ring_and_says_how_to_change_it():
    on = SimpleNamespace(active=True, max_entries=100_000)
    said = max_entries_refusal(5_000, on, True)  # type: ignore[arg-type]
    assert "switch it off first" in said and "100000" in said
    assert max_entries_refusal(100_000, on, True) == ""  # type: ignore[arg-type]
    assert max_entries_refusal(5_000, on, False) == ""  # type: ignore[arg-type]
