"""The Dask collector and the chart's cluster feed against scripted clients (no Dask needed):
what callers sharing one collector see, what a growing or shrinking cluster leaves behind, what
worker text reaches a terminal, and what a large cluster costs the chart."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from gpumem_nb import __version__
from gpumem_nb.cluster import (
    ROW_OK,
    ROW_UNKNOWN,
    ClusterReading,
    ClusterView,
    WorkerGpu,
)
from gpumem_nb.cluster.dask_backend import DaskCollector
from gpumem_nb.cluster.feed import CHART_POINTS, MAX_GPU_LINES, SUM_USED, ClusterFeed

from .helpers import hang_guard, wait_until

GiB = 1 << 30


def answer(name: str, uuid: str = "", used: int = 1 * GiB) -> dict[str, Any]:
    return {"gpumem_nb": __version__, "name": name, "host": "h", "pid": 1, "nvml": "ok",
            "devices": [{"index": 0, "uuid": uuid or f"GPU-{name}", "used_bytes": used,
                         "total_bytes": 141 * GiB}]}


class ScriptedClient:
    """Stands in for ``distributed.Client``: each ``run`` pops the next script entry (worker
    names, an exception to raise, or a dict of answers), after ``delay_s`` or once
    ``release`` is set, whichever comes first."""

    status = "running"

    class scheduler:
        address = "tcp://fake:8786"

    def __init__(self, script: list[Any], delay_s: float = 0.0) -> None:
        self.script = list(script)
        self.delay_s = delay_s
        self.calls = 0
        self.release = threading.Event()

    def run(self, fn: Any, on_error: str, callback_timeout: float) -> Any:
        self.calls += 1
        self.release.wait(self.delay_s)
        step = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, dict):
            return step
        return {f"tcp://{n}": answer(n) for n in step}


def test_a_caller_arriving_while_a_collection_is_out_shares_it_instead_of_reading_unknown():
    # The chart's feed and %gpumem cluster use one collector: the magic used to get every row
    # "unknown: the previous request has not been answered yet", and the chart a gap.
    # Out long enough for the second caller to arrive while it is.
    client = ScriptedClient([["0", "1"]], delay_s=1.0)
    collector = DaskCollector(client)
    readings: list[ClusterReading] = []
    feed = threading.Thread(target=lambda: readings.append(collector.collect(2.0)))
    feed.start()
    assert wait_until(lambda: client.calls == 1)  # the feed's request is out
    magic = collector.collect(2.0)
    feed.join()
    assert magic.status == ROW_OK and [r.name for r in magic.rows] == ["0", "1"]
    assert readings[0].status == ROW_OK
    assert client.calls == 1  # one broadcast for both


def test_a_shared_collection_that_gave_up_early_is_asked_again_within_the_callers_timeout():
    client = ScriptedClient([TimeoutError(), ["0"]], delay_s=0.3)
    collector = DaskCollector(client)
    first = threading.Thread(target=collector.collect, args=(0.3,))
    first.start()
    assert wait_until(lambda: client.calls == 1)  # the first request is out
    reading = collector.collect(3.0)
    first.join()
    assert reading.status == ROW_OK and client.calls == 2


def test_a_scheduler_that_never_answers_still_bounds_the_call():
    # The answer comes only when the test releases it: far past the hang guard.
    client = ScriptedClient([["0"]], delay_s=60.0)
    collector = DaskCollector(client)
    try:
        t0 = time.monotonic()
        reading = collector.collect(0.3)
        assert reading.status == ROW_UNKNOWN and time.monotonic() - t0 < hang_guard(1.0)
        t0 = time.monotonic()
        assert collector.collect(0.3).status == ROW_UNKNOWN  # joins the one out: not doubled
        assert time.monotonic() - t0 < hang_guard(1.0) and client.calls == 1
    finally:
        client.release.set()


def test_retired_workers_do_not_come_back_as_unknown_rows():
    collector = DaskCollector(ScriptedClient([["A", "B"], ["A", "C"], TimeoutError()]))
    assert [r.name for r in collector.collect(1.0).rows] == ["A", "B"]
    assert [r.name for r in collector.collect(1.0).rows] == ["A", "C"]  # B retired
    silent = collector.collect(1.0)
    assert silent.status == ROW_UNKNOWN
    assert [(r.name, r.status) for r in silent.rows] == [("A", ROW_UNKNOWN), ("C", ROW_UNKNOWN)]


def test_workers_seen_under_adaptive_scaling_are_not_kept_forever():
    batches = [[f"w{k * 1000 + i}" for i in range(1000)] for k in range(5)]
    collector = DaskCollector(ScriptedClient(batches))
    for _ in batches:
        collector.collect(5.0)
    assert len(collector._known) == 1000  # the last answer's workers, not all 5000 ever seen


def test_worker_rows_sort_as_numbered_not_as_strings():
    names = [str(i) for i in range(12)]
    reading = DaskCollector(ScriptedClient([names[::-1]])).collect(1.0)
    assert [r.name for r in reading.rows] == names


CONTROL = ("\x1b", "\x07", "\u202e", "\r")


def test_worker_names_and_errors_reach_a_terminal_escaped():
    client = ScriptedClient([{
        "tcp://a": {**answer("\x1b[31mevil\x1b[0m\nfake row"), "host": "h\u202eost"},
        "tcp://b": RuntimeError("multi\nline\x1b[2J error\x07"),
    }])
    text = str(ClusterView(DaskCollector(client).collect(1.0)))
    assert not any(c in text for c in CONTROL), repr(text)
    assert "\\x1b[31mevil\\x1b[0m\\nfake row" in text and "\\x1b[2J" in text
    rows = [line for line in text.splitlines() if "evil" in line or "error" in line]
    assert len(rows) == 2  # no row split in two by a name's newline


def test_a_scheduler_without_an_address_is_not_named_with_an_empty_gap():
    class NoAddress(ScriptedClient):
        scheduler = None

    text = str(ClusterView(DaskCollector(NoAddress([TimeoutError()])).collect(0.5)))
    assert "The dask scheduler did not answer: no answer within 0.5 s" in text


def test_a_client_closed_under_the_collector_says_it_is_closed_not_that_it_did_not_answer():
    client = ScriptedClient([["0"]])
    collector = DaskCollector(client)
    collector.collect(1.0)
    client.status = "closed"
    reading = collector.collect(1.0)
    text = str(ClusterView(reading))
    assert reading.status == "closed" and client.calls == 1
    assert "The dask client is closed, so its workers were not asked" in text
    assert "did not answer" not in text


# -- the chart's lines ---------------------------------------------------------------------
class Many:
    """A collector of ``n`` GPUs, one worker each, answering at once."""

    engine = "test"
    closed = False

    def __init__(self, n: int) -> None:
        self.n = n
        self.t = 0.0

    def collect(self, timeout_s: float) -> ClusterReading:
        self.t += 1
        return ClusterReading(t_s=self.t, rows=tuple(
            WorkerGpu(worker=f"tcp://w{i}", name=str(i), host=f"h{i // 8}", device=i % 8,
                      uuid=f"GPU-{i:04d}-xxxxxxxxxxxx", gpu_name="H200",
                      used_bytes=(i + int(self.t) % 3) << 30, total_bytes=141 << 30,
                      allocated_bytes=i << 29) for i in range(self.n)))

    def close(self) -> None: ...


def test_a_large_cluster_draws_its_sums_not_two_lines_per_gpu():
    # 64 GPUs drew 128 lines, rebuilt on the sampler's thread every tick (0.2 s a tick).
    feed = ClusterFeed(Many(64), lambda: 1.0)
    feed.poll_once()
    lines = feed.series(0.0)
    assert len(lines) == 2 and feed.summed
    assert lines[SUM_USED][1][-1] == round(sum(i + 1 for i in range(64)), 4)


def test_a_small_cluster_keeps_a_line_per_gpu():
    feed = ClusterFeed(Many(MAX_GPU_LINES), lambda: 1.0)
    feed.poll_once()
    assert len(feed.series(0.0)) == 2 * MAX_GPU_LINES and not feed.summed


def test_each_cluster_line_is_sent_in_bounded_points():
    feed = ClusterFeed(Many(4), lambda: 1.0)
    for _ in range(600):
        feed.poll_once()
    lines = feed.series(0.0)
    assert lines and all(len(xs) == len(ys) <= CHART_POINTS for xs, ys in lines.values())
    xs, _ = next(iter(lines.values()))
    assert xs[-1] == 600.0 and xs[0] < 100  # the newest point kept, the oldest still shown


def test_the_chart_rebuilds_no_cluster_line_between_collections(shell, no_gpu):
    pytest.importorskip("ipywidgets")
    from gpumem_nb.chart.live import show

    shell.run_cell("%load_ext gpumem_nb")
    m = shell._gpumem_nb_monitor
    m.sampler.stop()
    feed = ClusterFeed(Many(4), lambda: 1.0)
    feed.poll_once()
    m.feeds.cluster_feed = feed
    try:
        widget = show(m)
        m.sampler.tick()
        sent = widget.chart.extra
        built = feed.series(widget._t0_s)
        m.sampler.tick()  # no collection since: the very same lines, nothing rebuilt
        assert widget.chart.extra is sent and feed.series(widget._t0_s) is built
        feed.poll_once()
        m.sampler.tick()
        assert widget.chart.extra is not sent
    finally:
        m.feeds.cluster_feed = None
        m.end_chart()


def _device(**fields: Any) -> dict[str, Any]:
    return {"index": 0, "uuid": "GPU-x", "used_bytes": GiB, "total_bytes": 141 * GiB, **fields}


def _worker(devices: Any = None, **fields: Any) -> dict[str, Any]:
    return {"gpumem_nb": __version__, "name": "w", "host": "h", "pid": 1, "nvml": "ok",
            "devices": [_device()] if devices is None else devices, **fields}


# What the 2026-12-01b review's workers answered (t14), and more of the same kind: each field
# of the wrong type or out of range. Four of these gave a gpumem_nb traceback.
MALFORMED = {
    "devices a string": _worker("GPU-0"),
    "devices a list of ints": _worker([1, 2]),
    "an index mixing ints and strings": _worker([_device(index=0), _device(index="1")]),
    "used_bytes a string": _worker([_device(used_bytes="1 GiB")]),
    "used_bytes 2**1024": _worker([_device(used_bytes=2 ** 1024)]),
    "used_bytes 10**400": _worker([_device(used_bytes=10 ** 400)]),
    "used_bytes NaN": _worker([_device(used_bytes=float("nan"))]),
    "used_bytes negative": _worker([_device(used_bytes=-1)]),
    "used_bytes True": _worker([_device(used_bytes=True)]),
    "a list for a UUID": _worker([_device(uuid=["GPU-x"])]),
    "a dict for a name": _worker(name={"a": 1}),
    "a string pid": _worker(pid="1"),
    "a number for nvml": _worker([], nvml=3),
    "a string for the device status": _worker([_device(status=7)]),
}


@pytest.mark.parametrize("shape", sorted(MALFORMED))
def test_a_malformed_worker_answer_is_an_unreadable_row_not_a_traceback(shape):
    good = _worker(name="good")
    client = ScriptedClient([{"tcp://bad": MALFORMED[shape], "tcp://good": good}])
    reading = DaskCollector(client).collect(1.0)
    text = str(ClusterView(reading))
    ClusterView(reading)._repr_html_()
    bad = [r for r in reading.rows if r.worker == "tcp://bad"]
    assert bad and any(r.status == "unreadable" for r in bad), bad
    assert "unreadable: " in text
    # The good worker's row, and the sum over the readable GPUs, still read.
    assert [r.status for r in reading.rows if r.name == "good"] == [ROW_OK]
    assert "1 GPU(s)" in text or "2 GPU(s)" in text


@pytest.mark.parametrize("size", ["1 GiB", 2 ** 1024])
def test_the_charts_cluster_feed_lives_through_a_worker_answering_junk_for_a_size(size):
    # Before: a string or an int of 2**1024 for used_bytes ended the feed's thread, and the
    # chart's cluster lines stopped for good with no note.
    script = [{"tcp://w": _worker([_device(used_bytes=size)])}, {"tcp://w": _worker()}]
    feed = ClusterFeed(DaskCollector(ScriptedClient(script)), lambda: 0.05)
    first = feed.poll_once()
    assert not feed.ended
    assert first.rows[0].status == "unreadable"
    feed.poll_once()  # the next good answer is drawn
    assert any(v is not None for _, ys in feed.series(0.0).values() for v in ys)


def test_the_feed_turns_an_answer_it_cannot_draw_into_a_gap_that_says_why():
    class Weird:
        engine = "dask"
        closed = False

        def collect(self, timeout_s: float) -> ClusterReading:
            row = WorkerGpu(worker="w", uuid="GPU-x", used_bytes="junk")  # type: ignore[arg-type]
            return ClusterReading(t_s=time.monotonic(), rows=(row,))

        def close(self) -> None:
            pass

    feed = ClusterFeed(Weird(), lambda: 0.05)
    feed.start()
    try:
        assert wait_until(lambda: feed.collections >= 2)
        assert feed.running  # the thread went on
        assert feed.latest is not None and "could not be drawn" in feed.latest.detail
    finally:
        feed.stop()


def test_a_worker_running_another_gpumem_nb_version_is_named():
    old = {k: v for k, v in _worker(name="old").items() if k != "gpumem_nb"}
    client = ScriptedClient([{"tcp://a": _worker(name="alike"),
                              "tcp://b": _worker(name="other", gpumem_nb="0.0.9"),
                              "tcp://c": old}])
    reading = DaskCollector(client).collect(1.0)
    text = str(ClusterView(reading))
    assert f"run another gpumem_nb (0.0.9) than this kernel's {__version__}: other" in text
    assert "(older, which does not send its version)" in text and ": old" in text
    assert len(reading.notes) == 2
    assert not any("alike" in n for n in reading.notes)  # the same version is not called out


def test_a_hundred_thousand_devices_and_a_huge_name_print_bounded_and_fast():
    # Before: 2 x 100,000 devices took 62-73 s and printed 26.6 MB (121 MB of HTML), and a
    # 10 MB worker name was printed whole.
    many = [_device(index=i, uuid=f"GPU-{w}-{i}") for w in "ab" for i in range(100_000)]
    answers = {"tcp://a": _worker(many[:100_000], name="a"),
               "tcp://b": _worker(many[100_000:], name="b" * 10_000_000)}
    answers.update({f"tcp://w{i}": _worker([_device(uuid=f"GPU-w{i}")], name=f"w{i}")
                    for i in range(300)})
    t0 = time.perf_counter()
    reading = DaskCollector(ScriptedClient([answers])).collect(1.0)
    text = str(ClusterView(reading))
    html = ClusterView(reading)._repr_html_()
    elapsed = time.perf_counter() - t0
    assert elapsed < hang_guard(3.0), elapsed
    assert len(text) < 100_000 and len(html) < 200_000, (len(text), len(html))
    assert "device(s) beyond 64 per worker were left out" in text
    assert "The table shows 100 of 428 rows" in text
    assert "b" * 1000 not in text


class _TextRaises(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this exception's text raises too")


class _GetRaises(dict):  # type: ignore[type-arg]
    def get(self, *args: Any) -> Any:
        raise RuntimeError("get")


def test_a_worker_error_whose_text_raises_is_one_row_not_a_traceback():
    # Dask hands back what report() raised in the worker (on_error="return"): any class, any
    # __str__. Before: its f-string formatting raised out of collect(), a gpumem_nb traceback
    # in %gpumem cluster.
    client = ScriptedClient([{"tcp://bad": _TextRaises(), "tcp://odd": _GetRaises(_worker()),
                              "tcp://good": _worker(name="good")}])
    reading = DaskCollector(client).collect(1.0)
    text = str(ClusterView(reading))
    assert [r.status for r in reading.rows if r.name == "good"] == [ROW_OK]
    assert "_TextRaises" in text
    # A dict no check foresaw (its get raises): the backstop makes it one unreadable row.
    assert "the answer could not be read (RuntimeError)" in text


def test_workers_of_many_gpumem_nb_versions_get_a_bounded_note_not_one_line_each():
    # Before: 2,000 workers each naming its own version printed 2,000 notes (293 KB of text).
    answers = {f"tcp://w{i}": _worker(name=f"w{i}", gpumem_nb=f"0.0.{i}") for i in range(2000)}
    reading = DaskCollector(ScriptedClient([answers])).collect(1.0)
    assert len(reading.notes) <= 4, len(reading.notes)
    assert len(str(ClusterView(reading))) < 20_000
    assert any("1997 more gpumem_nb version(s)" in n for n in reading.notes), reading.notes
