"""The page's requests are read as the typed messages of ``chart/messages.py``; anything else
the comm carries (an old page, a forged message) is dropped, never an error in the kernel."""

from __future__ import annotations

import pytest

from gpumem_nb.chart.messages import CleanupAsked, DeviceAsked, done, read_request


def test_the_two_requests_the_page_sends_are_read_with_their_ids():
    assert read_request({"kind": "cleanup", "id": "c1"}) == CleanupAsked("c1")
    assert read_request({"kind": "device", "id": "d1", "value": 1}) == DeviceAsked("d1", 1)
    assert done("c1") == {"kind": "done", "id": "c1"}


@pytest.mark.parametrize("junk", [None, [], "cleanup", {"kind": "rm -rf"}, {"id": "x"},
                                  {"kind": ["cleanup"]}])
def test_a_message_that_is_no_request_is_dropped(junk):
    assert read_request(junk) is None


def test_an_id_that_is_no_short_text_is_not_answered_but_the_request_still_runs():
    assert read_request({"kind": "cleanup", "id": "x" * 65}) == CleanupAsked(None)
    assert read_request({"kind": "cleanup", "id": 7}) == CleanupAsked(None)


def test_a_dict_subclass_from_a_forged_message_is_dropped_without_running_its_code():
    class Hostile(dict):
        def get(self, *a, **k):  # type: ignore[override]
            raise AssertionError("ran the message's own code")

    assert read_request(Hostile(kind="cleanup")) is None
