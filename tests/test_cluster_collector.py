"""The Dask collector and the chart's cluster feed against scripted clients (no Dask needed):
what callers sharing one collector see, what a growing or shrinking cluster leaves behind, what
worker text reaches a terminal, and what a large cluster costs the chart."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from gpumem_nb.cluster import (
    ROW_OK,
    ROW_UNKNOWN,
    ClusterReading,
    ClusterView,
    WorkerGpu,
)
from gpumem_nb.cluster.dask_backend import DaskCollector
from gpumem_nb.cluster.feed import CHART_POINTS, MAX_GPU_LINES, SUM_USED, ClusterFeed

GiB = 1 << 30


def answer(name: str, uuid: str = "", used: int = 1 * GiB) -> dict[str, Any]:
    return {"name": name, "host": "h", "pid": 1, "nvml": "ok",
            "devices": [{"index": 0, "uuid": uuid or f"GPU-{name}", "used_bytes": used,
                         "total_bytes": 141 * GiB}]}


class ScriptedClient:
    """Stands in for ``distributed.Client``: each ``run`` pops the next script entry (worker
    names, an exception to raise, or a dict of answers), after ``delay_s``."""

    status = "running"

    class scheduler:
        address = "tcp://fake:8786"

    def __init__(self, script: list[Any], delay_s: float = 0.0) -> None:
        self.script = list(script)
        self.delay_s = delay_s
        self.calls = 0

    def run(self, fn: Any, on_error: str, callback_timeout: float) -> Any:
        self.calls += 1
        time.sleep(self.delay_s)
        step = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, dict):
            return step
        return {f"tcp://{n}": answer(n) for n in step}


def test_a_caller_arriving_while_a_collection_is_out_shares_it_instead_of_reading_unknown():
    # The chart's feed and %gpumem cluster use one collector: the magic used to get every row
    # "unknown: the previous request has not been answered yet", and the chart a gap.
    client = ScriptedClient([["0", "1"]], delay_s=0.4)
    collector = DaskCollector(client)
    readings: list[ClusterReading] = []
    feed = threading.Thread(target=lambda: readings.append(collector.collect(2.0)))
    feed.start()
    time.sleep(0.1)  # the feed's request is out
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
    time.sleep(0.05)
    reading = collector.collect(3.0)
    first.join()
    assert reading.status == ROW_OK and client.calls == 2


def test_a_scheduler_that_never_answers_still_bounds_the_call():
    collector = DaskCollector(ScriptedClient([["0"]], delay_s=5.0))
    t0 = time.monotonic()
    reading = collector.collect(0.3)
    assert reading.status == ROW_UNKNOWN and time.monotonic() - t0 < 1.0
    t0 = time.monotonic()
    assert collector.collect(0.3).status == ROW_UNKNOWN  # joins the one out: not doubled
    assert time.monotonic() - t0 < 1.0 and collector.client.calls == 1


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
    from gpumem_nb.widget import show

    shell.run_cell("%load_ext gpumem_nb")
    m = shell._gpumem_nb_monitor
    m.sampler.stop()
    feed = ClusterFeed(Many(4), lambda: 1.0)
    feed.poll_once()
    m.cluster_feed = feed
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
        m.cluster_feed = None
        m.end_chart()
