"""``%gpumem watch --compact``: one live line per GPU, in IPython's real shell with the fakes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpumem_nb.chart.compact import SPARK_POINTS, SparkHistory, compact_lines, spark_text
from gpumem_nb.chart.picture import NO_LIVE_NOTE, PICTURE_STYLE
from gpumem_nb.kernel import current_monitor

from .fakes import GiB
from .helpers import spaced

VIEW = "application/vnd.jupyter.widget-view+json"


def run(ip: Any, source: str) -> Any:
    result = ip.run_cell(source, store_history=True)
    spaced(ip)
    return result


@pytest.fixture
def compact(shell: Any, fake_gpu: Any, capsys: Any) -> Any:
    run(shell, "%load_ext gpumem_nb")
    mon = current_monitor(shell)
    mon.sampler.stop()
    shell.user_ns["cuda"] = fake_gpu.cuda
    run(shell, "%gpumem watch --compact")
    capsys.readouterr()
    return mon.compact


def test_compact_line_shows_used_reserved_allocated_and_headroom_per_gpu(compact, shell):
    run(shell, "t = cuda.tensor(3 * 2**30)")
    compact.monitor.sampler.tick()
    compact.update()
    (line,) = compact.widget.lines
    assert line["label"] == "GPU 0"
    assert line["allocated"] == "3.00 GiB" and line["reserved"] == "3.00 GiB"
    assert line["total"].endswith("GiB")
    used = float(line["used"].split()[0])
    total = float(line["total"].split()[0])
    assert float(line["headroom"].split()[0]) == pytest.approx(total - used, abs=0.02)


def test_the_last_cells_reserved_delta_is_on_the_line(compact, shell):
    run(shell, "t = cuda.tensor(2 * 2**30)")
    compact.monitor.flush()
    compact.update()
    assert "reserved +2.00 GiB" in compact.widget.lines[0]["delta"]
    assert compact.widget.lines[0]["delta"].startswith("[")


def test_the_sparkline_follows_the_readings_and_stays_bounded(compact, shell):
    for i in range(SPARK_POINTS + 20):
        shell.user_ns[f"t{i}"] = shell.user_ns["cuda"].tensor(2**28)
        compact.monitor.sampler.tick()
    compact.update()
    spark = compact.widget.lines[0]["spark"]
    assert len(spark) == SPARK_POINTS
    assert spark[-1] == 100 and spark[0] < spark[-1]  # growing memory: a rising line
    assert all(isinstance(v, int) and 0 <= v <= 100 for v in spark)


def test_an_update_is_a_few_hundred_bytes_and_sent_only_when_a_figure_changed(compact, shell):
    compact.monitor.sampler.tick()
    compact.update()
    before = compact.updates
    assert not compact.update()  # nothing changed: nothing sent
    assert compact.updates == before
    run(shell, "t = cuda.tensor(2**30)")
    compact.monitor.sampler.tick()
    assert compact.update()
    size = len(json.dumps(compact.widget.lines, separators=(",", ":")))
    assert size < 700, size


def test_the_sampler_thread_sends_at_most_one_update_a_second(compact, shell, monkeypatch):
    import gpumem_nb.chart.compactview as cv

    now = [1000.0]
    monkeypatch.setattr(cv.time, "monotonic", lambda: now[0])
    compact._sent_at_s = now[0]
    sent = compact.updates
    for i in range(10):  # ten readings within the second, each with new memory
        shell.user_ns[f"u{i}"] = shell.user_ns["cuda"].tensor(2**29)
        compact.monitor.sampler.tick()
    assert compact.updates == sent
    now[0] += 1.01
    compact.monitor.sampler.tick()
    assert compact.updates == sent + 1


def test_compact_shows_a_widget_then_a_static_line_hidden_while_the_widget_shows(
        shell, fake_gpu, capsys):
    shown: list[dict[str, Any]] = []
    run(shell, "%load_ext gpumem_nb")
    mon = current_monitor(shell)
    import gpumem_nb.ipython.commands.watch as watch

    real = watch.display

    def spy(obj: Any, **kw: Any) -> Any:
        shown.append(obj)
        return real(obj, **kw)

    watch.display = spy
    try:
        run(shell, "%gpumem watch --compact")
    finally:
        watch.display = real
    assert mon.compact is not None
    view, static = shown
    assert VIEW in view and view["text/html"] == ""
    assert ".gpumem-compact-live" in PICTURE_STYLE  # the rule that hides the static line
    assert "GPU 0 used" in static["text/plain"] and "headroom" in static["text/plain"]
    assert NO_LIVE_NOTE in static["text/html"]


def test_without_a_gpu_the_compact_line_reads_host_ram(shell, no_gpu, capsys):
    run(shell, "%load_ext gpumem_nb")
    run(shell, "%gpumem watch --compact")
    mon = current_monitor(shell)
    mon.sampler.tick()
    mon.compact.update()
    (line,) = mon.compact.widget.lines
    assert line["label"] == "host RAM" and line["used"].endswith("iB")
    assert line["total"] == "" and line["reserved"] == ""


def test_watch_stop_turns_the_compact_reading_into_its_static_line(compact, shell, capsys):
    widget = compact.widget
    run(shell, "%gpumem watch --stop")
    assert "chart stopped" in capsys.readouterr().out
    assert current_monitor(shell).compact is None and widget.comm is None


def test_unload_closes_the_compact_reading(compact, shell):
    widget = compact.widget
    run(shell, "%unload_ext gpumem_nb")
    assert widget.comm is None


@pytest.mark.parametrize("flags", ["--replay bundled", "--live", "--cluster", "--stop"])
def test_compact_with_a_flag_of_the_big_chart_is_a_usage_error(shell, fake_gpu, flags):
    run(shell, "%load_ext gpumem_nb")
    result = run(shell, f"%gpumem watch --compact {flags}")
    assert type(result.error_in_exec).__name__ == "UsageError"


def test_spark_text_draws_low_to_high_bars():
    assert spark_text([0, 50, 100]) == "▁▅█"


def test_no_nvml_reads_the_allocator_as_used():
    from gpumem_nb.model import AllocatorReading, DeviceSample, Sample

    alloc = AllocatorReading(allocated_bytes=GiB, reserved_bytes=2 * GiB, active_bytes=GiB,
                             inactive_split_bytes=0, peak_allocated_bytes=GiB,
                             peak_reserved_bytes=2 * GiB, num_alloc_retries=0, num_ooms=0)
    sample = Sample(t_s=1.0, wall_s=1.0, rss_bytes=1, devices=(DeviceSample(0, None, alloc),))
    spark = SparkHistory()
    spark.add(sample)
    (line,) = compact_lines(sample, spark)
    assert line.used == "2.00 GiB" and line.total == "—" and line.headroom == "—"


def test_the_compact_reading_sends_its_own_small_script_that_loads_nothing_else():
    from gpumem_nb.chart.livechart import CompactReading, compact_esm_bytes

    assert compact_esm_bytes() < 10_000
    assert "import " not in CompactReading._esm.replace("export default", "")
    assert "http" not in CompactReading._esm.replace("http://www.w3.org/2000/svg", "")
