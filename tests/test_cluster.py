"""A real Dask LocalCluster (worker processes) whose workers see the project's fake GPUs
through a preload: the %gpumem cluster table, devices counted once by UUID, workers without
NVML or gpumem_nb, a scheduler that does not answer, and the chart's cluster lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

distributed = pytest.importorskip("distributed")

from gpumem_nb.cluster import (  # noqa: E402 - after the skip
    ROW_NO_GPUMEM,
    ROW_NO_NVML,
    ROW_OK,
    ROW_UNKNOWN,
    ClusterView,
)
from gpumem_nb.cluster.dask_backend import DaskCollector  # noqa: E402
from gpumem_nb.cluster.feed import ClusterFeed  # noqa: E402

from .helpers import hang_guard, wait_until  # noqa: E402

pytestmark = pytest.mark.slow  # a Dask LocalCluster of worker processes

GiB = 1 << 30
PRELOAD = str(Path(__file__).with_name("cluster_preload.py"))
SHARED = "GPU-shared-0000"
# A wedged driver or scheduler: far past any hang guard, so a guard fails when the code waits
# for it; each test ends its hang when done (a flag file, an event) instead of sleeping it out.
HANG_S = 60.0
SCHEDULER_BLOCKED = threading.Event()
SCHEDULER_RELEASE = threading.Event()


def block_the_scheduler() -> None:
    """Run on the scheduler (in this process: LocalCluster's scheduler is local), by
    reference: its event loop stops until the test releases it."""
    SCHEDULER_BLOCKED.set()
    SCHEDULER_RELEASE.wait(HANG_S)


def local_cluster(scenarios: dict[str, Any]) -> Any:
    old = dict(os.environ)
    os.environ["GPUMEM_TEST_CLUSTER"] = json.dumps(scenarios)
    # Dask's own NVML monitor would read the fake too; it is not what is tested here.
    os.environ["DASK_DISTRIBUTED__DIAGNOSTICS__NVML"] = "False"
    try:
        return distributed.LocalCluster(n_workers=len(scenarios), processes=True,
                                        threads_per_worker=1, dashboard_address=":0",
                                        preload=[PRELOAD], silence_logs=40)
    finally:
        os.environ.clear()
        os.environ.update(old)


@pytest.fixture(scope="module")
def shared_gpu(tmp_path_factory: Any) -> Iterator[Any]:
    """Two workers on one GPU: worker 0 has torch with CUDA up, worker 1 never imported it."""
    flag = tmp_path_factory.mktemp("hang") / "hang"
    cluster = local_cluster({
        "0": {"gpus": [{"uuid": SHARED, "share": 3 * GiB, "others": 2 * GiB}],
              "torch": {"allocated": 2 * GiB, "reserved": 5 * GiB // 2, "peak": 4 * GiB}},
        "1": {"gpus": [{"uuid": SHARED, "share": 2 * GiB, "others": 3 * GiB}],
              "hang_s": HANG_S, "hang_when": str(flag)},
    })
    client = distributed.Client(cluster)
    client.hang_flag = flag
    yield client
    client.close()
    cluster.close()


@pytest.fixture(scope="module")
def broken_workers() -> Iterator[Any]:
    cluster = local_cluster({"0": {"nvml": "missing"}, "1": {"gpumem_nb": "missing"}})
    client = distributed.Client(cluster)
    yield client
    client.close()
    cluster.close()


def by_name(reading: Any) -> dict[str, Any]:
    return {r.name: r for r in reading.rows}


def test_one_row_per_worker_and_gpu_with_its_own_share_and_allocator(shared_gpu):
    reading = DaskCollector(shared_gpu).collect(5.0)
    rows = by_name(reading)
    assert sorted(rows) == ["0", "1"] and reading.status == ROW_OK
    w0, w1 = rows["0"], rows["1"]
    assert (w0.uuid, w0.used_bytes, w0.total_bytes) == (SHARED, 5 * GiB, 141 * GiB)
    assert w0.process_bytes == 3 * GiB and w1.process_bytes == 2 * GiB  # each its own share
    assert (w0.allocated_bytes, w0.reserved_bytes, w0.peak_allocated_bytes) == (
        2 * GiB, 5 * GiB // 2, 4 * GiB)
    assert (w1.allocated_bytes, w1.reserved_bytes) == (None, None)  # no torch there
    assert w0.pid != w1.pid != os.getpid() and w0.host


def test_two_workers_on_one_gpu_count_it_once(shared_gpu):
    reading = DaskCollector(shared_gpu).collect(5.0)
    (device,) = reading.devices()
    assert (device.uuid, device.used_bytes, device.workers) == (SHARED, 5 * GiB, ("0", "1"))
    text = str(ClusterView(reading))
    assert "2 worker(s) on 1 GPU(s), each GPU counted once by UUID: 5.00 GiB used of " \
           "141.00 GiB" in text
    assert "shared by workers 0, 1" in text


def test_the_workers_never_import_torch_for_us(shared_gpu):
    DaskCollector(shared_gpu).collect(5.0)
    imported = shared_gpu.run(lambda: "torch" in sys.modules)
    names = {w["name"]: a for a, w in shared_gpu.scheduler_info()["workers"].items()}
    assert imported[names[1]] is False  # worker 1 had not imported torch: still has not
    assert imported[names[0]] is True  # worker 0's own (fake) torch


def test_a_worker_without_nvml_and_one_without_gpumem_nb_say_so(broken_workers):
    rows = by_name(DaskCollector(broken_workers).collect(5.0))
    assert rows["0"].status == ROW_NO_NVML and "driver" in rows["0"].detail
    (missing,) = [r for r in rows.values() if r.status == ROW_NO_GPUMEM]
    assert "install gpumem-nb" in missing.detail
    text = str(ClusterView(DaskCollector(broken_workers).collect(5.0)))
    assert "no NVML" in text and "no gpumem_nb" in text


def test_a_scheduler_that_does_not_answer_shows_unknown_rows_without_holding_the_cell(
        shared_gpu, shell, no_gpu, capsys):
    shell.run_cell("%load_ext gpumem_nb")
    shell.user_ns["client"] = shared_gpu
    assert shell.run_cell("%gpumem cluster client").error_in_exec is None  # workers seen
    capsys.readouterr()
    shared_gpu.hang_flag.touch()  # worker 1's NVML now hangs: the broadcast waits on it
    try:
        t0 = time.monotonic()
        result = shell.run_cell("%gpumem cluster client --timeout 0.5")
        took = time.monotonic() - t0
        assert result.error_in_exec is None and took < hang_guard(1.5), took
        out = capsys.readouterr().out
        assert "did not answer: no answer within 0.5 s" in out
        reading = shell.run_line_magic("gpumem", "cluster client --timeout 0.5 -o")
        # The one call still out is not doubled; its workers' rows read unknown, by name.
        assert reading.status == ROW_UNKNOWN
        assert {r.name: r.status for r in reading.rows} == {"0": ROW_UNKNOWN, "1": ROW_UNKNOWN}
        assert all(r.used_bytes is None for r in reading.rows)
    finally:
        shared_gpu.hang_flag.unlink()  # the driver answers
    # Once the hung call returns, the next one answers again.
    assert wait_until(lambda: DaskCollector(shared_gpu).collect(1.0).status == ROW_OK, 15.0)


def test_a_blocked_scheduler_loop_never_blocks_the_collection_past_its_timeout(shared_gpu):
    collector = DaskCollector(shared_gpu)
    collector.collect(5.0)
    SCHEDULER_BLOCKED.clear()
    SCHEDULER_RELEASE.clear()
    blocker = threading.Thread(target=shared_gpu.run_on_scheduler, args=(block_the_scheduler,))
    blocker.start()
    try:
        assert SCHEDULER_BLOCKED.wait(10.0)
        t0 = time.monotonic()
        reading = collector.collect(0.5)
        assert time.monotonic() - t0 < hang_guard(1.0) and reading.status == ROW_UNKNOWN
    finally:
        SCHEDULER_RELEASE.set()
        blocker.join()


def test_watch_cluster_draws_one_line_per_gpu_at_most_once_a_second(
        shared_gpu, shell, no_gpu):
    shell.run_cell("%load_ext gpumem_nb")
    shell.user_ns["client"] = shared_gpu
    m = shell._gpumem_nb_monitor
    m.sampler.stop()
    assert shell.run_cell("%gpumem watch --cluster client").error_in_exec is None
    feed = m.cluster_feed
    assert feed.pace_s == 1.0  # the sampler's 0.5 s, but at most once a second
    assert wait_until(lambda: feed.collections >= 2, 10.0)
    m.sampler.tick()
    chart = m.widget.chart
    names = [s["name"] for s in chart.series if s["name"].startswith("cluster ")]
    used = [n for n in names if n.endswith("NVML used")]
    assert len(used) == 1 and SHARED[:12] in used[0]  # one line for the shared GPU
    assert chart.extra[used[0]][1][-1] == 5.0
    alloc = [n for n in names if "allocated" in n]
    assert chart.extra[alloc[0]][1][-1] == 2.0  # worker 0's allocator (worker 1 has none)
    m.stop_cluster_feed()
    assert not feed.running


def test_closing_the_client_while_the_chart_runs_ends_the_feed_and_nothing_breaks(
        shared_gpu, shell, no_gpu):
    own = distributed.Client(shared_gpu.cluster, set_as_default=False)
    shell.run_cell("%load_ext gpumem_nb")
    shell.user_ns["mine"] = own
    m = shell._gpumem_nb_monitor
    shell.run_cell("%gpumem watch --cluster mine")
    feed = m.cluster_feed
    assert wait_until(lambda: feed.collections >= 1, 10.0)
    own.close()
    assert wait_until(lambda: not feed.running, 10.0) and "closed" in feed.ended
    (used,) = [k for k in feed.series(0.0) if k.endswith("NVML used")]
    assert feed.series(0.0)[used][1][-1] is None  # a gap once closed, not the last value
    m.sampler.tick()
    assert m.sampler.errors == {} and m.widget is not None
    assert shell.run_cell("x = 1").error_in_exec is None


def test_the_feed_turns_a_collector_that_raises_into_a_gap():
    class Broken:
        engine = "test"
        closed = False

        def collect(self, timeout_s: float) -> Any:
            raise RuntimeError("boom")

        def close(self) -> None: ...

    feed = ClusterFeed(Broken(), lambda: 0.5)
    reading = feed.poll_once()
    assert reading.status == "error" and "boom" in reading.detail


def test_without_distributed_the_magic_says_how_to_install_it(shell, no_gpu, monkeypatch,
                                                              capsys):
    monkeypatch.setitem(sys.modules, "distributed", None)
    shell.run_cell("%load_ext gpumem_nb")
    result = shell.run_cell("%gpumem cluster")
    err = capsys.readouterr().err + str(result.error_in_exec or "")
    assert "pip install 'gpumem-nb[cluster]'" in err


def test_no_client_and_a_wrong_variable_are_plain_usage_errors(shell, no_gpu, capsys):
    shell.run_cell("%load_ext gpumem_nb")
    shell.user_ns["notaclient"] = 3
    for line, words in (("cluster notaclient", "notaclient is a int, not a distributed.Client"),
                        ("cluster nosuch", "there is no variable 'nosuch'"),
                        ("cluster client --timeout 0", "--timeout takes seconds")):
        shell.run_cell(f"%gpumem {line}")
        assert words in capsys.readouterr().err, line


def test_loading_and_reading_never_import_dask():
    code = ("import sys\nfrom IPython.testing.globalipapp import start_ipython\n"
            "ip = start_ipython()\nip.run_cell('%load_ext gpumem_nb')\n"
            "ip.run_cell('%gpumem')\nip.run_cell('%gpumem history')\n"
            "print(sorted(m for m in ('distributed', 'dask', 'gpumem_nb.cluster') "
            "if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "GPUMEM_NB_AUTO_SHOW": "0"})
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr


def test_an_asynchronous_client_is_read_not_crashed_on(shared_gpu, shell, no_gpu, capsys):
    # `await Client(addr, asynchronous=True)`: Client.run handed back a coroutine, and
    # %gpumem cluster died on "'coroutine' object has no attribute 'items'".
    # Only this test's threads are checked at the end: an earlier test's stuck reader (a
    # hung fake NVML ends a few seconds later) must not fail this one.
    earlier = set(threading.enumerate())
    shell.run_cell("%load_ext gpumem_nb")
    shell.user_ns["addr"] = shared_gpu.scheduler.address
    made = shell.run_cell("from distributed import Client\n"
                          "ac = await Client(addr, asynchronous=True, set_as_default=False)")
    assert made.error_in_exec is None
    try:
        reading = shell.run_line_magic("gpumem", "cluster ac -o")
        assert reading.status == ROW_OK and sorted(by_name(reading)) == ["0", "1"]
        m = shell._gpumem_nb_monitor
        m.sampler.stop()
        assert shell.run_cell("%gpumem watch --cluster ac").error_in_exec is None
        feed = m.cluster_feed
        assert wait_until(lambda: feed.collections >= 1, 10.0)
        assert feed.latest is not None and feed.latest.status == ROW_OK  # no gap forever
        assert "RuntimeWarning" not in capsys.readouterr().err
    finally:
        shell.run_cell("%unload_ext gpumem_nb")
        shell.run_cell("await ac.close()")
    def ours() -> list[str]:
        return [t.name for t in threading.enumerate()
                if t.name.startswith("gpumem_nb") and t not in earlier]

    assert wait_until(lambda: not ours(), 5.0), ours()


def test_a_closed_client_is_a_plain_usage_error_for_the_table_and_the_chart(
        shared_gpu, shell, no_gpu, capsys):
    shell.run_cell("%load_ext gpumem_nb")
    gone = distributed.Client(shared_gpu.cluster, set_as_default=False)
    gone.close()
    shell.user_ns["gone"] = gone
    capsys.readouterr()
    for line in ("cluster gone", "watch --cluster gone"):
        result = shell.run_cell(f"%gpumem {line}")
        err = capsys.readouterr().err
        assert "gone is closed: make a new client" in err, (line, err)
        assert "did not answer" not in err and "Traceback" not in err
        assert type(result.error_in_exec).__name__ == "UsageError"
    assert shell._gpumem_nb_monitor.cluster_feed is None


def test_the_cluster_feed_stops_with_the_sampler_and_with_the_chart(shared_gpu, shell, no_gpu,
                                                                     capsys):
    # After %gpumem stop, or with the chart gone, the feed kept broadcasting Client.run
    # to every worker once a second.
    shell.run_cell("%load_ext gpumem_nb")
    shell.user_ns["client"] = shared_gpu
    m = shell._gpumem_nb_monitor
    for stop in ("%gpumem stop", "%gpumem watch --stop", "%gpumem watch --replay bundled"):
        m.sampler.start()
        shell.run_cell("%gpumem watch --live --cluster client")
        feed = m.cluster_feed
        assert feed is not None and feed.running, stop
        assert shell.run_cell(stop).error_in_exec is None
        assert not feed.running and m.cluster_feed is None, stop
    assert "sampler and the cluster's lines stopped" in capsys.readouterr().out


def test_a_failed_replay_beside_cluster_starts_no_feed(shared_gpu, shell, no_gpu, capsys):
    shell.run_cell("%load_ext gpumem_nb")
    shell.user_ns["client"] = shared_gpu
    capsys.readouterr()
    shell.run_cell("%gpumem watch --cluster client --replay /nonexistent.json")
    assert "does not go with --replay" in capsys.readouterr().err
    assert shell._gpumem_nb_monitor.cluster_feed is None
    shell.run_cell("%gpumem watch --cluster nosuch")  # a bad name: nothing started either
    assert shell._gpumem_nb_monitor.cluster_feed is None


@pytest.mark.parametrize("value", ["5e-324", "-inf", "-1e3"])
def test_a_timeout_no_scheduler_can_meet_is_refused_in_a_sentence(shell, no_gpu, capsys,
                                                                   value):
    shell.run_cell("%load_ext gpumem_nb")
    capsys.readouterr()
    result = shell.run_cell(f"%gpumem cluster --timeout {value}")
    err = capsys.readouterr().err
    assert "--timeout takes seconds from 0.1 to 60" in err, err
    assert type(result.error_in_exec).__name__ == "UsageError" and "Traceback" not in err


def test_an_object_whose_class_attribute_raises_is_not_a_client_and_no_traceback(
        shell, no_gpu, capsys):
    class Liar:
        @property  # type: ignore[misc]
        def __class__(self) -> Any:
            raise RuntimeError("__class__ boom")

    shell.run_cell("%load_ext gpumem_nb")
    shell.user_ns["liar"] = Liar()
    capsys.readouterr()
    shell.run_cell("%gpumem cluster liar")
    err = capsys.readouterr().err
    assert "not a distributed.Client" in err and "Traceback" not in err
