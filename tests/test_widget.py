"""The live chart, built in IPython's real shell with scripted readings."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest

from gpumem_nb.kernel import current_monitor
from gpumem_nb.model import DeviceSample, NvmlReading, Sample
from gpumem_nb.svgchart import thin_labels
from gpumem_nb.timeline import (
    MAX_POINTS,
    SERIES,
    Arrays,
    Timeline,
    collapse_runs,
    keep_peaks,
    values_of,
)

from .fakes import GiB
from .helpers import run_spaced as run


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


def from_page(widget: Any, content: dict[str, Any]) -> list[Any]:
    """A request as livechart.js sends it (a custom message on the chart's comm); returns
    what the kernel sends back on it."""
    sent: list[Any] = []
    original = widget.chart.send
    widget.chart.send = lambda msg, buffers=None: sent.append(msg)
    try:
        widget.chart._handle_custom_msg(content, [])
        widget.monitor.sampler.tick()
    finally:
        widget.chart.send = original
    return sent


def test_chart_shows_nvml_process_reserved_and_allocated_in_gib(chart, fake_gpu):
    held = fake_gpu.cuda.tensor(2 * GiB)
    chart.monitor.sampler.tick()
    assert held is not None
    assert chart.chart.meta["devices"] is None  # one GPU: nothing to choose
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


def test_small_values_keep_the_hovers_precision_not_a_tenth_of_a_mib_off():
    """The tester's N4: 3.25 MiB read 3.3 MiB and 620.81 MiB read 620.9 MiB in the hover,
    every y rounded to 1e-4 GiB (0.1 MiB)."""
    from array import array

    mib = 1 / 1024
    _xs, ys = Arrays(array("d", [0.0, 1.0, 2.0]),
                    array("d", [3.25 * mib, 620.81 * mib, 14.123456])).lists()
    assert [round(y / mib, 2) for y in ys[:2]] == [3.25, 620.81]
    assert ys[2] == 14.1235  # GiB shown to 2 decimals: 4 are kept, not more bytes


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

    from gpumem_nb.chart.livechart import esm_bytes

    esm = chart.chart._esm
    assert not re.search(r"^\s*import\b|\bimport\s*\(", esm, re.M)
    assert "https://" not in esm.replace("http://www.w3.org/2000/svg", "")
    # The controls and the picture saved with the notebook are drawn here too: still far
    # inside the first watch's 200 KB.
    assert esm_bytes() < 40_000


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
    answers = from_page(chart, {"kind": "cleanup", "id": "c1"})
    assert "what each step freed" in chart.report.value
    assert "empty_cache" in fake_gpu.cuda.calls
    assert "keep" in shell.user_ns and fake_gpu.cuda.devices[0].allocated == GiB
    assert answers == [{"kind": "done", "id": "c1"}]  # the page's button stops waiting


def test_a_cleanup_button_run_stopped_by_ctrl_c_shows_what_it_did_and_stops_waiting(
        chart, shell, fake_gpu, monkeypatch):
    run(shell, "def f():\n    big = cuda.tensor(2**30)\n    raise ValueError\nf()")

    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(fake_gpu.cuda, "empty_cache", interrupted)
    sent: list[Any] = []
    monkeypatch.setattr(chart.chart, "send", lambda msg, buffers=None: sent.append(msg))
    with pytest.raises(KeyboardInterrupt):
        chart.chart._handle_custom_msg({"kind": "cleanup", "id": "c3"}, [])
    chart.monitor.sampler.tick()
    assert "interrupted (Ctrl-C) in its empty_cache step" in chart.report.value
    assert "dropped the stored ValueError" in chart.report.value
    assert sent == [{"kind": "done", "id": "c3"}]  # the page's button stops waiting


def test_cleanup_asked_for_while_a_cell_runs_runs_when_that_cell_ends_as_the_page_says(
        chart, fake_gpu):
    """The page shows "queued until the cell ends" at the click; a request that reaches the
    kernel mid-cell (ipykernel's subshells) must then do just that, not ask for a click."""
    mon = chart.monitor
    sent: list[Any] = []
    chart.chart.send = lambda msg, buffers=None: sent.append(msg)
    mon.pre_run_cell(type("Info", (), {"raw_cell": "train()", "cell_id": "long"})())
    try:
        mon.sampler.tick()
        assert chart.chart.meta["busy"] is True  # what the page's label follows
        chart.chart._handle_custom_msg({"kind": "cleanup", "id": "c2"}, [])
        mon.sampler.tick()
        assert "empty_cache" not in fake_gpu.cuda.calls and not sent
    finally:
        mon.post_run_cell(None)
    assert "empty_cache" in fake_gpu.cuda.calls  # at the cell's end, on its thread
    mon.sampler.tick()
    assert sent == [{"kind": "done", "id": "c2"}]
    assert "what each step freed" in chart.report.value
    assert chart.chart.meta["busy"] is False


def test_hooks_and_buttons_never_draw_the_figure_themselves(chart, shell):
    before = chart.draws
    run(shell, "z = 1")  # the hook enqueues and asks for a tick; the sampler is stopped here
    chart.request_cleanup()
    # With the sampler stopped the producer draws once itself, never the hook.
    assert chart.draws - before <= 1


def test_pause_stops_drawing_but_not_recording(chart, fake_gpu):
    chart.chart.paused = True  # as the page sets it
    draws = chart.draws
    chart.monitor.sampler.tick()
    assert chart.draws == draws and chart.timelines[0].n > 0
    chart.chart.paused = False
    chart.monitor.sampler.tick()
    assert chart.draws > draws


def test_paused_the_header_says_so_and_the_controls_still_follow_the_cells(chart, fake_gpu):
    """The tester's D8: " (paused)" never showed (the paused chart never redrew its header),
    and "Clean up (a cell is running)" stayed after the cell ended."""
    mon = chart.monitor
    chart.chart.paused = True
    assert "(paused)" in chart.header.value
    frozen = chart.header.value
    keep = fake_gpu.cuda.tensor(2 * GiB)
    mon.pre_run_cell(type("Info", (), {"raw_cell": "train()", "cell_id": "p"})())
    mon.sampler.tick()
    assert chart.chart.meta["busy"] is True
    mon.post_run_cell(None)
    mon.sampler.tick()
    assert chart.chart.meta["busy"] is False
    assert chart.header.value == frozen  # the numbers held still too
    chart.chart.paused = False
    assert "(paused)" not in chart.header.value and "2.00 GiB" in chart.header.value
    assert keep is not None


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
    chart.picture_handle = type("Handle", (), {"update": lambda self, obj, raw: updates.append(
        obj["image/svg+xml"])})()
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
    from gpumem_nb.chart import live as widget_mod

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
    assert w.chart.meta["devices"] == [["all GPUs (sum)", -1], ["GPU 0", 0], ["GPU 1", 1]]
    assert from_page(w, {"kind": "device", "value": 0, "id": "d0"}) == [
        {"kind": "done", "id": "d0"}]
    assert mon.config.device == 0  # the selector goes through the monitor
    assert w.chart.meta["device"] == 0
    assert trace(w, "allocated")[1][-1] == pytest.approx(0.0)
    from_page(w, {"kind": "device", "value": 1, "id": "d1"})
    assert mon.config.device == 1
    assert trace(w, "allocated")[1][-1] == pytest.approx(3.0)
    # A value the selector never offered changes nothing, and is still answered.
    assert from_page(w, {"kind": "device", "value": 7, "id": "d7"}) == [
        {"kind": "done", "id": "d7"}]
    assert from_page(w, {"kind": "device", "value": True, "id": "d8"}) and mon.config.device == 1
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
    assert w.device == 1 and w.chart.meta["device"] == 1
    assert _last_point_moves(w, mon, cuda, 1)  # not a frozen line
    from_page(w, {"kind": "device", "value": 0, "id": "d"})
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
    assert chart._closed and chart.chart.comm is None and chart.header.comm is None
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


def test_the_live_replay_draws_the_recorded_spikes_at_their_recorded_times(shell, no_gpu,
                                                                             capsys):
    """The tester's D4: the replay's chart sampled its recording every 0.5 s, so the hover
    read 8 GiB where the recording says 14 GiB, and its first point sat 0.5 s early."""
    from gpumem_nb.sources.replay import load_trace

    recorded, _ = load_trace(None)
    run(shell, "%load_ext gpumem_nb")
    run(shell, "%gpumem watch --replay bundled")
    mon = current_monitor(shell)
    mon.replay.sampler.stop()
    src = mon.replay.source
    now = [500.0]
    src._clock = lambda: now[0]
    src._t0 = 500.0
    w = mon.widget
    for k in range(1, 31):  # the sampler's 0.5 s ticks, 15 s into the recording
        now[0] = 500.0 + k * 0.5
        mon.replay.sampler.tick()
    xs, ys = trace(w, "allocated")
    t0 = recorded[0].t_s
    want = [(s.t_s - t0, s.devices[0].allocator.allocated_bytes / GiB) for s in recorded
            if s.t_s - t0 <= 15.0 and s.devices[0].allocator is not None]
    for x, y in want:  # the step line the browser draws reads every recorded reading
        at = int(np.searchsorted(xs, x + 1e-3)) - 1  # the last point at x (sent to 1 ms)
        assert at >= 0 and ys[at] == pytest.approx(y, abs=1e-3), (x, y, xs[at], ys[at])
    assert np.nanmax(ys) == pytest.approx(14.0)  # the spikes
    assert xs[0] == pytest.approx(0.0)
    assert w.chart.meta["x_title"] == "seconds into the recording"


def test_the_picture_made_by_the_stop_cell_numbers_that_cell(chart, shell):
    """The tester's D9: the saved picture kept a "[*]" for the %gpumem watch --stop cell."""
    import base64

    handle = chart.display_handle = _Handle()
    run(shell, "x = 1")
    run(shell, "%gpumem watch --stop")
    (bundle, _), = handle.updates
    svg = base64.b64decode(bundle["text/html"].split("base64,", 1)[1].split('"', 1)[0]).decode()
    assert "[*]" not in svg and "[*]" not in bundle["image/svg+xml"]
    count = shell.execution_count - 1  # the --stop cell's own number
    assert f">[{count}]<" in bundle["image/svg+xml"]


def test_watch_stop_says_what_it_stopped_or_that_nothing_was_live(chart, shell, capsys):
    capsys.readouterr()
    run(shell, "%gpumem watch --stop")
    assert "chart stopped" in capsys.readouterr().out
    run(shell, "%gpumem watch --stop")
    assert "no chart was live" in capsys.readouterr().out


def test_the_picture_names_the_chart_once_in_its_alt_text(chart, shell):
    """The tester's D10: "gpumem_nb chart, gpumem_nb chart: GPU 0 ..."."""
    import re

    alt = re.search(r'alt="([^"]*)"', chart.plain_bundle()["text/html"])
    assert alt is not None and alt.group(1).count("gpumem_nb chart") == 1, alt


def test_the_live_legend_lists_the_lines_in_the_pictures_order(chart):
    from gpumem_nb.svgchart import LEGEND_ORDER

    specs = sorted(chart.chart.series, key=lambda s: s["legend"])
    assert [s["key"] for s in specs] == [k for k in LEGEND_ORDER
                                         if k in {s["key"] for s in specs}]


@pytest.mark.parametrize("color", ['red"><script>alert(1)</script>', "url(javascript:x)",
                                   "#12345", "", "red;background:url(x)", None])
def test_a_series_colour_that_is_not_a_colour_is_refused_where_it_is_made(color):
    """The tester's D6: a colour went into the hover box's innerHTML."""
    from gpumem_nb.svgchart import SeriesStyle

    with pytest.raises(ValueError, match="colour"):
        SeriesStyle("x", color, 1.5)  # type: ignore[arg-type]
    for fine in ("#8c564b", "#abc", "teal", "rgb(1, 2, 3)", "hsl(120 50% 50%)"):
        assert SeriesStyle("x", fine, 1.5).color == fine
    for width, dash in ((0, ""), (float("nan"), ""), (1.5, "6 3\"/>")):
        with pytest.raises(ValueError):
            SeriesStyle("x", "#000", width, dash)


def test_watch_stop_keeps_the_cleanup_report_the_charts_button_printed(chart, shell, fake_gpu):
    # Before: the picture that replaced the chart had no report, so --stop wiped the only
    # account of what the Clean up button freed.
    handle = chart.display_handle = _Handle()
    chart.request_cleanup()
    current_monitor(shell).sampler.tick()
    assert "what each step freed" in chart.report.value
    run(shell, "%gpumem watch --stop")
    (bundle, _), = handle.updates
    assert "what each step freed" in bundle["text/html"]
    assert "freed" in bundle["text/plain"]


def test_the_script_sent_without_its_comment_lines_still_parses(tmp_path):
    """livechart.py sends livechart.js less its whole-line comments: a comment-like line inside
    a template literal would be cut out of it, and the page would get a broken module."""
    import shutil
    import subprocess

    from gpumem_nb.chart.livechart import LiveChart

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    module = tmp_path / "livechart.mjs"
    module.write_text(LiveChart._esm, encoding="utf-8")
    result = subprocess.run([node, "--check", str(module)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
