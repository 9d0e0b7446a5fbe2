"""The live chart, built in IPython's real shell with scripted readings."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest

from gpumem_nb.magics import current_monitor
from gpumem_nb.model import DeviceSample, NvmlReading, Sample
from gpumem_nb.svgchart import thin_labels
from gpumem_nb.timeline import (
    MAX_POINTS,
    SERIES,
    Timeline,
    collapse_runs,
    keep_peaks,
    values_of,
)

from .fakes import GiB
from .helpers import spaced


def run(ip: Any, source: str, cell_id: str | None = None) -> Any:
    """Run a cell as people do: with time after it for the sampler's next reading."""
    result = ip.run_cell(source, store_history=True, cell_id=cell_id)
    spaced(ip)
    return result


@pytest.fixture
def chart(shell: Any, fake_gpu: Any, capsys: Any) -> Any:
    """The extension loaded on a fake H200, sampler stopped so the test drives every tick."""
    run(shell, "%load_ext gpumem_nb")
    mon = current_monitor(shell)
    mon.sampler.stop()
    shell.user_ns["cuda"] = fake_gpu.cuda
    run(shell, "%gpumem watch")
    capsys.readouterr()
    return mon.widget


def trace(widget: Any, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A series as the browser draws it (livechart.js): the history part, then the recent."""
    old = widget.chart.history.get(name, [[], []])
    new = widget.chart.recent.get(name, [[], []])

    def arr(v: Any) -> np.ndarray:
        return np.asarray([np.nan if x is None else x for x in v], dtype=float)

    return (np.concatenate([arr(old[0]), arr(new[0])]),
            np.concatenate([arr(old[1]), arr(new[1])]))


def labels(widget: Any) -> list[str]:
    return [label for _, label in widget.chart.marks]


def test_chart_shows_nvml_process_reserved_and_allocated_in_gib(chart, fake_gpu):
    held = fake_gpu.cuda.tensor(2 * GiB)
    chart.monitor.sampler.tick()
    assert held is not None
    assert chart.selector.layout.display == "none"  # one GPU: nothing to choose
    assert trace(chart, "allocated")[1][-1] == pytest.approx(2.0)
    assert trace(chart, "reserved")[1][-1] == pytest.approx(2.0)
    # Sent rounded to 0.1 MiB: the browser needs no more.
    assert trace(chart, "nvml_used")[1][-1] == pytest.approx(2.0 + 500 / 1024, abs=1e-4)
    assert trace(chart, "process")[1][-1] == pytest.approx(2.0 + 500 / 1024, abs=1e-4)
    meta = chart.chart.meta
    assert meta["note"] == "total 141.0 GiB · headroom 138.5 GiB"  # 141 − (2 GiB + 500 MiB)
    assert meta["total"] == pytest.approx(141.0)  # the browser draws it only once in range


def test_every_cell_boundary_gets_a_mark_and_the_newest_its_count(chart, shell):
    for i in range(3):
        run(shell, f"k{i} = {i}")
    chart.monitor.sampler.tick()
    counts = [r.execution_count for r in chart.monitor.history.records()][-3:]
    assert labels(chart)[-1] == f"[{counts[-1]}]"
    assert len(chart.chart.marks) == len(chart.monitor.marks)
    t0 = chart.monitor.started_t_s
    assert [x for x, _ in chart.chart.marks] == [
        round(m.t_s - t0, 3) for m in chart.monitor.marks]


def test_cell_labels_in_a_long_session_never_overlap():
    xs = [i * 0.37 for i in range(500)]  # a cell every 0.37 s for three minutes
    gap = (xs[-1] - xs[0]) / 14
    keep = thin_labels(xs, gap)
    assert keep[-1] == 499  # the newest cell is always labelled
    assert all(xs[b] - xs[a] >= gap for a, b in itertools.pairwise(keep))
    assert 10 <= len(keep) <= 15


def test_chart_state_is_plain_json_with_null_gaps_never_numpy_or_nan(chart, fake_gpu, shell):
    # NaN is not JSON: a gap must travel as null, and numpy values must never reach a trait
    # (the browser would get typed arrays or the kernel fail to serialise).
    import json

    fake_gpu.cuda.tensor(GiB)
    run(shell, "x = 1")
    chart.monitor.sampler.tick()
    w = chart.chart
    for name in ("series", "history", "recent", "marks", "meta"):
        json.dumps(getattr(w, name), allow_nan=False)
    for part in (w.history, w.recent):
        for xs, ys in part.values():
            assert all(type(v) in (float, int) for v in xs)
            assert all(v is None or type(v) in (float, int) for v in ys)


def test_the_chart_sends_its_own_small_script_that_loads_nothing_else(chart):
    # Plotly's FigureWidget sent 5 MB per chart (issue 17); a CDN import would fail offline.
    import re

    from gpumem_nb.livechart import esm_bytes

    esm = chart.chart._esm
    assert not re.search(r"^\s*import\b|\bimport\s*\(", esm, re.M)
    assert "https://" not in esm.replace("http://www.w3.org/2000/svg", "")
    assert esm_bytes() < 30_000


def test_header_row_shows_the_numbers_and_the_last_cell_peak(chart, shell):
    run(shell, "t = cuda.tensor(3 * 2**30)")
    chart.monitor.sampler.tick()
    value = chart.header.value
    assert "NVIDIA H200" in value and "3.00 GiB" in value and "500.00 MiB" in value


def test_accumulation_banner_names_the_cell_cause_and_holders(chart, shell):
    assert chart.banner.layout.display == "none"
    for _ in range(3):
        run(shell, "y = cuda.tensor(64 * 2**20)\ny", cell_id="rerun")
    chart.monitor.sampler.tick()
    assert chart.banner.layout.display == "block"
    assert "keeps growing" in chart.banner.value and "live tensors" in chart.banner.value
    assert "Out[" in chart.banner.value


def test_cleanup_button_runs_the_safe_cleanup_and_shows_the_report(chart, shell, fake_gpu):
    run(shell, "def f():\n    big = cuda.tensor(2**30)\n    raise ValueError\nf()")
    run(shell, "keep = cuda.tensor(2**30)")
    chart.cleanup_button.click()
    assert "what each step freed" in chart.report.value
    assert "empty_cache" in fake_gpu.cuda.calls
    assert "keep" in shell.user_ns and fake_gpu.cuda.devices[0].allocated == GiB


def test_cleanup_button_while_a_cell_runs_says_so_and_does_nothing(chart, fake_gpu):
    mon = chart.monitor
    mon.pre_run_cell(type("Info", (), {"raw_cell": "train()", "cell_id": "long"})())
    try:
        mon.sampler.tick()
        assert chart.cleanup_button.description == "Clean up (a cell is running)"
        chart.cleanup_button.click()
        assert "A cell is running" in chart.report.value
        assert "empty_cache" not in fake_gpu.cuda.calls
    finally:
        mon.post_run_cell(None)
    mon.sampler.tick()
    assert chart.cleanup_button.description == "Clean up"


def test_hooks_and_buttons_never_draw_the_figure_themselves(chart, shell):
    before = chart.draws
    run(shell, "z = 1")  # the hook enqueues and asks for a tick; the sampler is stopped here
    chart.cleanup_button.click()
    # With the sampler stopped the producer draws once itself, never the hook.
    assert chart.draws - before <= 1


def test_pause_stops_drawing_but_not_recording(chart, fake_gpu):
    chart.pause_button.value = True
    draws = chart.draws
    chart.monitor.sampler.tick()
    assert chart.draws == draws and chart.timelines[0].n > 0
    chart.pause_button.value = False
    chart.monitor.sampler.tick()
    assert chart.draws == draws + 1


def test_watch_twice_shows_the_same_single_widget(chart, shell):
    live = chart.chart
    run(shell, "%gpumem watch")
    assert current_monitor(shell).widget is chart and chart.chart is live


def test_display_bundle_carries_a_picture_of_the_chart_for_saved_notebooks(chart, shell):
    import base64
    import xml.etree.ElementTree as ET

    run(shell, "t = cuda.tensor(3 * 2**30)")
    chart.monitor.sampler.tick()
    bundle = chart._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert "NVML used / total" in bundle["text/plain"]
    html_ = bundle["text/html"]
    assert html_.startswith('<img src="data:image/svg+xml;base64,') and "<table" in html_
    svg = base64.b64decode(html_.split("base64,", 1)[1].split('"', 1)[0]).decode()
    assert svg == bundle["image/svg+xml"]
    ET.fromstring(svg)  # well-formed
    assert "allocated" in svg and "GPU 0" in svg


def test_refresh_static_updates_the_displayed_picture_to_the_end_of_the_run(chart, shell):
    updates = []
    chart.display_handle = type("Handle", (), {"update": lambda self, obj: updates.append(
        obj._repr_mimebundle_()["image/svg+xml"])})()
    first = chart._repr_mimebundle_()["image/svg+xml"]
    run(shell, "t = cuda.tensor(5 * 2**30)")
    chart.monitor.sampler.tick()
    assert chart.refresh_static() and updates and updates[-1] != first


def test_unload_closes_the_widget(chart, shell):
    run(shell, "%unload_ext gpumem_nb")
    assert chart._closed and chart.chart.comm is None


def test_without_a_gpu_the_chart_says_so_and_plots_host_ram(shell, no_gpu, capsys):
    run(shell, "%load_ext gpumem_nb")
    mon = current_monitor(shell)
    mon.sampler.stop()
    run(shell, "%gpumem watch")
    mon.sampler.tick()
    w = mon.widget
    assert "No GPU visible" in w.header.value
    rss = next(s for s in w.chart.series if s["key"] == "rss")
    assert not rss["hidden"] and len(trace(w, "rss")[1]) >= 1
    assert {s["key"] for s in w.chart.series} == set(SERIES)


def test_replay_drives_the_chart_from_the_bundled_h200_session(shell, no_gpu, capsys):
    run(shell, "%load_ext gpumem_nb")
    run(shell, "%gpumem watch --replay bundled")
    mon = current_monitor(shell)
    mon.replay.sampler.stop()
    mon.replay.sampler.tick()
    assert "NVIDIA H200" in mon.widget.header.value
    assert "REPLAY" in mon.widget.header.value  # never mistaken for this machine


def test_replay_never_touches_the_users_records_marks_or_allocator(shell, fake_gpu, capsys):
    run(shell, "%load_ext gpumem_nb")
    mon = current_monitor(shell)
    shell.user_ns["cuda"] = fake_gpu.cuda
    run(shell, "%gpumem watch --replay bundled")
    for _ in range(5):
        mon.replay.sampler.tick()
    marks_before = len(mon.marks)
    run(shell, "small = cuda.tensor(2**20)")
    run(shell, "%gpumem bogus")  # raises a UsageError, as in the report
    for _ in range(5):
        mon.replay.sampler.tick()
    for rec in mon.history.records():
        for d in rec.devices:  # the user's fake GPU, never the recording's 10+ GiB
            assert (d.peak_allocated_bytes or 0) <= 2**20
            assert (d.nvml_used_after_bytes or 0) < 2 * GiB
    assert not mon.verdicts
    assert len(mon.marks) == marks_before + 2  # the user's cells are still marked...
    w = mon.widget
    assert not w.chart.marks  # ...but not over the recording
    assert "empty_cache" not in fake_gpu.cuda.calls
    assert not [c for c in fake_gpu.cuda.calls if c.startswith("reset_peak")]
    assert "last cell" not in w.header.value or "(recording)" in w.header.value
    run(shell, "%gpumem watch --live")
    assert mon.replay is None and mon.widget.replay is None


def test_bad_replay_file_is_a_usage_error(shell, no_gpu, capsys, tmp_path):
    run(shell, "%load_ext gpumem_nb")
    result = run(shell, f"%gpumem watch --replay {tmp_path / 'missing.json'}")
    assert type(result.error_in_exec).__name__ == "UsageError"


# -- bounded data --------------------------------------------------------------------------
def nvml_sample(t: float, used: int) -> Sample:
    nv = NvmlReading(0, "H200", "GPU-a", "", 141 * GiB, used)
    return Sample(t_s=t, wall_s=t, rss_bytes=GiB, devices=(DeviceSample(0, nv, None),))


def test_an_hour_at_10hz_keeps_at_most_2000_points_and_the_spike():
    tl = Timeline()
    rng = np.random.default_rng(0)
    for i in range(36_000):
        used = int((10 + rng.random()) * GiB) if i != 1234 else 120 * GiB  # one 0.1 s spike
        s = nvml_sample(i / 10, used)
        tl.append(s.t_s, values_of(s, 0))
    assert tl.n <= tl.capacity
    a = tl.arrays("nvml_used", 0.0)
    assert len(a.x) <= MAX_POINTS
    assert float(np.nanmax(a.y)) == pytest.approx(120.0)  # the peak survived
    assert np.all(np.diff(a.x) > 0)


def test_flat_memory_collapses_to_the_ends_of_each_run():
    x = np.arange(10.0)
    y = np.array([1, 1, 1, 2, 2, 2, 2, 1, 1, 1], dtype=float)
    cx, cy = collapse_runs(x, y)
    assert list(cx) == [0, 2, 3, 6, 7, 9] and list(cy) == [1, 1, 2, 2, 1, 1]


def test_keep_peaks_keeps_every_bucket_extreme():
    x = np.arange(10_000.0)
    y = np.zeros(10_000)
    y[17], y[4321] = 5.0, -3.0
    kx, ky = keep_peaks(x, y, 500)
    assert len(kx) <= 500 and 5.0 in ky and -3.0 in ky
    assert not any(math.isnan(v) for v in ky)


def test_long_history_is_resent_only_every_refresh_while_recent_points_flow(chart, fake_gpu):
    from gpumem_nb import widget as widget_mod

    tick = chart.monitor.sampler.tick
    tick()
    sent = []
    chart.chart.observe(lambda change: sent.append(1), names="history")
    history = chart.chart.history
    recent_lengths = []
    for _ in range(3):
        fake_gpu.cuda.tensor(2**20)
        tick()
        recent_lengths.append(len(chart.chart.recent["allocated"][0]))
    assert chart.chart.history == history and not sent  # untouched between refreshes
    assert recent_lengths[-1] >= 2
    chart._history_until_s -= widget_mod.HISTORY_REFRESH_S
    tick()
    assert sent and chart.chart.history != history


def test_a_running_cell_is_marked_with_a_star_until_it_ends(chart):
    mon = chart.monitor
    mon.pre_run_cell(type("Info", (), {"raw_cell": "train()", "cell_id": "t"})())
    mon.sampler.tick()
    assert labels(chart)[-1] == "[*]"
    mon.post_run_cell(type("R", (), {"execution_count": 42, "error_in_exec": None,
                                     "error_before_exec": None})())
    mon.sampler.tick()
    assert labels(chart)[-1] == "[42]"


def test_two_gpus_get_a_selector_and_switching_redraws_that_gpu(shell, two_fake_gpus):
    cuda = two_fake_gpus
    run(shell, "%load_ext gpumem_nb")
    mon = current_monitor(shell)
    mon.sampler.stop()
    run(shell, "%gpumem watch")
    w = mon.widget
    held = cuda.tensor(3 * GiB, device=1)
    mon.sampler.tick()
    assert w.selector.layout.display == "flex" and w.selector.options == (
        ("all GPUs (sum)", -1), ("GPU 0", 0), ("GPU 1", 1))
    w.selector.value = 0
    mon.sampler.tick()
    assert mon.config.device == 0  # the dropdown goes through the monitor
    assert trace(w, "allocated")[1][-1] == pytest.approx(0.0)
    w.selector.value = 1
    mon.sampler.tick()
    assert mon.config.device == 1
    assert trace(w, "allocated")[1][-1] == pytest.approx(3.0)
    assert held is not None


def _last_point_moves(w: Any, mon: Any, cuda: Any, device: int) -> bool:
    """The chart is live on ``device``: an allocation there shows up as a new point."""
    before = trace(w, "allocated")[1][-1]
    keep = cuda.tensor(GiB, device=device)
    mon.sampler.tick()
    moved = trace(w, "allocated")[1][-1] == pytest.approx(before + 1.0)
    del keep
    return bool(moved)


def test_config_device_from_a_cell_moves_the_chart_too(shell, two_fake_gpus):
    cuda = two_fake_gpus
    run(shell, "%load_ext gpumem_nb")
    mon = current_monitor(shell)
    mon.sampler.stop()
    run(shell, "%gpumem watch")
    w = mon.widget
    run(shell, "%gpumem config --device 1")
    mon.sampler.tick()
    assert w.device == 1 and w.selector.value == 1
    assert _last_point_moves(w, mon, cuda, 1)  # not a frozen line
    w.selector.value = 0
    mon.sampler.tick()
    assert _last_point_moves(w, mon, cuda, 0)


def test_saved_device_setting_is_what_the_next_chart_shows(shell, two_fake_gpus):
    run(shell, "%load_ext gpumem_nb")
    run(shell, "%gpumem config --device 1 --save")
    run(shell, "%reload_ext gpumem_nb")
    mon = current_monitor(shell)
    run(shell, "%gpumem watch")
    mon.sampler.stop()
    mon.sampler.tick()
    assert mon.config.device == mon.widget.device


def test_this_process_figure_is_the_listed_one_everywhere(chart, shell, fake_gpu, capsys):
    from gpumem_nb.views import Snapshot

    keep = fake_gpu.cuda.tensor(600 * 2**20)
    # NVML's "used" counts 8.81 MiB nobody's listing accounts for (seen on the H200): a
    # share derived as used minus the others would say 8.81 MiB more than the listing.
    fake_gpu.gpu.used_bytes += int(8.81 * 2**20)
    sample = chart.monitor.sampler.tick()
    listed = fake_gpu.gpu.procs[0][1]
    assert sample.devices[0].nvml.process_bytes == listed
    mon = chart.monitor
    status_row = Snapshot(status=mon.source.status(), sample=mon.read()).rows()[0]
    assert status_row[2] in chart.header.value
    assert keep is not None


# -- when the chart ends (issue 17) -------------------------------------------------------------
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


class _Handle:
    """Stands in for the DisplayHandle ``%gpumem watch`` keeps: records each update."""

    def __init__(self) -> None:
        self.updates: list[Any] = []

    def update(self, obj: Any, **kw: Any) -> None:
        self.updates.append((obj, kw))


def test_ending_the_chart_turns_its_outputs_into_the_picture_so_no_reopen_reads_model_not_found(
        chart, shell, fake_gpu):
    run(shell, "t = cuda.tensor(3 * 2**30)")
    chart.monitor.sampler.tick()
    handle = chart.display_handle = _Handle()
    run(shell, "%gpumem watch --stop")
    (bundle, kw), = handle.updates
    assert kw == {"raw": True} and WIDGET_VIEW not in bundle
    assert bundle["image/svg+xml"].startswith("<svg") and "<img" in bundle["text/html"]
    assert "NVML used / total" in bundle["text/plain"]
    assert chart._closed and chart.chart.comm is None and chart.cleanup_button.comm is None
    assert current_monitor(shell).widget is None
    run(shell, "%gpumem watch")  # a new chart, live again
    assert current_monitor(shell).widget is not chart


def test_every_display_of_the_chart_shares_one_display_id(chart, shell):
    mon = current_monitor(shell)
    assert chart.display_handle is not None
    assert chart.display_handle.display_id == chart.display_id
    run(shell, "%gpumem watch")
    assert mon.widget.display_handle.display_id == chart.display_id


def test_a_kernel_shutting_down_turns_the_outputs_into_the_picture_and_leaves_the_comms(
        chart, shell):
    """ipykernel sets exit_now while it handles a shutdown or restart request. The comms are
    left to the exit: a restarting JupyterLab has dropped them already, and a close for each
    logged 'Comm not found' in the browser console (23 per restart with plotly's chart)."""
    handle = chart.display_handle = _Handle()
    try:
        shell.exit_now = True
    finally:
        shell.exit_now = False
    (bundle, _), = handle.updates
    assert WIDGET_VIEW not in bundle and "image/svg+xml" in bundle
    assert chart._closed and chart.chart.comm is not None  # not closed: no message sent
    assert current_monitor(shell).widget is None


def test_reload_ext_ends_the_chart_too(chart, shell):
    handle = chart.display_handle = _Handle()
    run(shell, "%reload_ext gpumem_nb")
    assert handle.updates and WIDGET_VIEW not in handle.updates[0][0]
    assert chart._closed and chart.chart.comm is None


def test_watch_stop_with_a_replay_flag_is_a_usage_error(chart, shell):
    result = run(shell, "%gpumem watch --stop --replay bundled")
    assert type(result.error_in_exec).__name__ == "UsageError"


def test_the_saved_picture_of_a_replay_is_the_whole_recorded_story_not_its_first_seconds(
        shell, no_gpu, capsys):
    """Issue 17: 00's saved picture was flat, the first 3 s of the replay, all at 0 B."""
    import base64
    import re

    run(shell, "%load_ext gpumem_nb")
    run(shell, "%gpumem watch --replay bundled")
    mon = current_monitor(shell)
    mon.replay.sampler.stop()
    mon.replay.sampler.tick()  # a moment into the recording
    svg = mon.widget.plain_bundle()["image/svg+xml"]
    assert "seconds into the recording" in svg
    ticks = [float(t) for t in re.findall(r'<text x="\d+" y="\d+" text-anchor="end">([\d.]+)<',
                                          svg)]
    assert max(ticks) >= 12, ticks  # the 14.6 GiB the recording reaches, on the y axis
    assert "at 28 s" in svg  # to the end of the recording
    html_ = mon.widget.plain_bundle()["text/html"]
    assert base64.b64decode(html_.split("base64,", 1)[1].split('"', 1)[0]).decode() == svg


def test_another_feature_adds_a_named_series_and_the_chart_draws_it(chart, fake_gpu):
    from gpumem_nb.svgchart import SeriesStyle

    chart.add_series("worker-1", SeriesStyle("worker 1", "#8c564b", 1.5, "2 3"),
                     lambda sample: 3 * GiB)
    chart.monitor.sampler.tick()
    chart.monitor.sampler.tick()
    spec = next(s for s in chart.chart.series if s["key"] == "worker-1")
    assert spec["name"] == "worker 1" and spec["dash"] == "2 3"
    assert trace(chart, "worker-1")[1][-1] == pytest.approx(3.0)
    chart.remove_series("worker-1")
    chart.monitor.sampler.tick()
    assert "worker-1" not in {s["key"] for s in chart.chart.series}
    with pytest.raises(ValueError):
        chart.add_series("allocated", SeriesStyle("x", "#000", 1.0), lambda s: None)
