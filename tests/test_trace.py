"""``%%gpumem --trace``: the replay of history entries, the recording's on/off discipline, and
the views, with a fake allocator that records Python stacks as torch does."""

from __future__ import annotations

import json
import os
import pickle
import sys
import time
from typing import Any

import pytest
from IPython.core.error import UsageError

from gpumem_nb import trace
from gpumem_nb.kernel import current_monitor
from gpumem_nb.sources.torch import TorchDebug
from gpumem_nb.trace import CellTracer, TraceReport, TraceTimeline, analyze, site_of
from gpumem_nb.trace.replay import _MAX_POINTS
from gpumem_nb.trace.sites import _STDLIB

from .fakes import FakeCuda, GiB, MiB, fake_torch
from .helpers import hang_guard

TORCH_DIR = "/usr/lib/python3/site-packages/torch/"
SKIP = (TORCH_DIR,)
CELL = "<ipython-input-7-0123456789ab>"


def frames(*where: tuple[str, int, str]) -> list[dict[str, Any]]:
    """Innermost first, as torch records them."""
    return [{"filename": f, "line": n, "name": name} for f, n, name in where]


TORCH_FRAMES = [(TORCH_DIR + "nn/modules/linear.py", 125, "forward"),
                (TORCH_DIR + "nn/modules/module.py", 1750, "_call_impl")]


def alloc(addr: int, size: int, t: float, line: int, *inner: tuple[str, int, str]) -> dict:
    return {"action": "alloc", "addr": addr, "size": size, "time_us": t,
            "frames": frames(*inner, *TORCH_FRAMES, (CELL, line, "<module>"))}


def free(addr: int, size: int, t: float, completed: bool = True) -> list[dict]:
    out = [{"action": "free_requested", "addr": addr, "size": size, "time_us": t}]
    if completed:
        out.append({"action": "free_completed", "addr": addr, "size": size, "time_us": t + 1})
    return out


def test_sites_at_the_peak_and_alive_at_the_end_are_the_lines_that_allocated():
    entries = [
        alloc(1, 256 * MiB, 1000, 1),
        alloc(2, GiB, 2000, 2),
        *free(2, GiB, 3000),
        alloc(3, 64 * MiB, 4000, 3),
        alloc(4, 64 * MiB, 5000, 3),
    ]
    d = analyze(entries, skip=SKIP)
    assert d.peak_bytes == GiB + 256 * MiB and d.end_bytes == 256 * MiB + 128 * MiB
    assert [(s.site.line, s.nbytes, s.allocations) for s in d.at_peak] == [
        (2, GiB, 1), (1, 256 * MiB, 1)]
    assert [(s.site.line, s.nbytes, s.allocations) for s in d.alive_at_end] == [
        (1, 256 * MiB, 1), (3, 128 * MiB, 2)]
    assert d.at_peak[0].site.in_cell and d.at_peak[0].label.startswith("cell line 2")
    assert d.peak_ms == 1.0  # from the first entry


def test_torch_frames_are_skipped_and_a_function_site_names_its_cell_line():
    s = site_of(frames(*TORCH_FRAMES, ("/home/me/model.py", 42, "block"),
                       ("/home/me/model.py", 80, "forward"), (CELL, 9, "<module>")), SKIP)
    assert (s.filename, s.line, s.function, s.via) == ("/home/me/model.py", 42, "block",
                                                       "cell line 9")
    assert s.label == "me/model.py:42 in block  (from cell line 9)"


def test_stdlib_frames_are_skipped_but_libraries_installed_beside_them_are_sites():
    stdlib = _STDLIB
    lib = os.path.join(stdlib, "site-packages", "transformers", "modeling.py")
    s = site_of(frames((os.path.join(stdlib, "functools.py"), 10, "wrapper"),
                       (lib, 300, "attention"), (CELL, 2, "<module>")), SKIP)
    assert (s.filename, s.line, s.via) == (lib, 300, "cell line 2")


def test_a_build_that_records_outermost_first_is_read_the_right_way_round():
    ipython = "/venv/site-packages/IPython/core/interactiveshell.py"
    outer_first = frames((ipython, 3600, "run_code"), (CELL, 4, "<module>"),
                         ("/home/me/model.py", 42, "block"), *TORCH_FRAMES)
    assert site_of(outer_first, (*SKIP, "/venv/site-packages/IPython/")).line == 42


def test_no_recorded_stack_is_said_plainly():
    assert site_of([], SKIP).label == "(no Python stack recorded)"


def test_only_allocations_inside_the_window_count_and_earlier_frees_are_ignored():
    entries = [alloc(1, GiB, 10, 1), alloc(2, 2 * GiB, 20, 2), *free(1, GiB, 1500),
               alloc(3, 64 * MiB, 2000, 3)]
    d = analyze(entries, since_us=1000, skip=SKIP)
    assert d.peak_bytes == 64 * MiB and d.end_bytes == 64 * MiB
    assert [s.site.line for s in d.alive_at_end] == [3]


def test_histories_without_free_requested_still_free_at_free_completed():
    entries = [alloc(1, GiB, 1, 1),
               {"action": "free_completed", "addr": 1, "size": GiB, "time_us": 2},
               alloc(1, 2 * GiB, 3, 2)]  # the address reused
    d = analyze(entries, skip=SKIP)
    assert d.end_bytes == 2 * GiB and d.peak_bytes == 2 * GiB


def test_a_free_requested_then_completed_counts_once_even_when_the_address_is_reused():
    entries = [alloc(1, GiB, 1, 1), *free(1, GiB, 2), alloc(1, GiB, 4, 2),
               {"action": "free_completed", "addr": 1, "size": GiB, "time_us": 5}]
    d = analyze(entries, skip=SKIP)
    assert d.end_bytes == 0  # the late free_completed belongs to the reused block


def test_an_oom_entry_records_what_was_live_at_the_failure():
    entries = [alloc(1, 40 * GiB, 1, 1), alloc(2, 30 * GiB, 2, 2),
               {"action": "oom", "size": 100 * GiB, "device_free": 5 * GiB, "time_us": 3}]
    d = analyze(entries, skip=SKIP)
    assert d.oom_requested_bytes == 100 * GiB and d.oom_ms is not None
    assert [(s.site.line, s.nbytes) for s in d.at_oom] == [(1, 40 * GiB), (2, 30 * GiB)]


def test_a_long_history_is_drawn_with_bounded_points_keeping_the_peak():
    entries = []
    for i in range(20_000):
        entries.append(alloc(i, MiB, i * 10, 1 + i % 3))
        if i != 12_345:
            entries += free(i, MiB, i * 10 + 5, completed=False)
    # A spike in the middle: the peak must survive downsampling.
    entries.insert(2 * 12_345 + 1, alloc(10**9, GiB, 123_451, 7))
    entries.append(free(10**9, GiB, 10**7, completed=False)[0])
    start = time.perf_counter()
    d = analyze(entries, skip=SKIP)
    took = time.perf_counter() - start
    print(f"analyze: {len(entries)} entries in {took * 1e3:.0f} ms")
    assert len(d.times_ms) <= _MAX_POINTS + 3
    assert d.peak_bytes == GiB + 2 * MiB
    total_at = [sum(s.mib[i] for s in d.series) for i in range(len(d.times_ms))]
    assert max(total_at) == pytest.approx((GiB + 2 * MiB) / MiB)
    assert took < hang_guard(2.0)


def test_the_timeline_is_plain_plotly_json_with_a_static_fallback():
    entries = [alloc(1, GiB, 1000, 1), alloc(2, 512 * MiB, 2000, 2), *free(1, GiB, 3000)]
    view = TraceTimeline(analyze(entries, skip=SKIP))
    bundle = view._repr_mimebundle_()
    fig = bundle["application/vnd.plotly.v1+json"]
    text = json.dumps(fig)  # what the notebook stores: must be plain JSON
    assert "http" not in text and "<script" not in text  # no CDN, nothing to fetch
    assert [t["name"].split(":")[0] for t in fig["data"]] == ["cell line 1", "cell line 2"]
    assert all(t["stackgroup"] == "live" for t in fig["data"])
    assert fig["data"][0]["y"][-1] == 0 and fig["data"][1]["y"][-1] == 512
    # The static picture (tests/test_chart_pictures.py): an SVG, also as an <img>.
    assert bundle["image/svg+xml"].startswith("<svg")
    assert bundle["text/html"].startswith('<img src="data:image/svg+xml;base64,')
    assert "timeline" in bundle["text/plain"]


# --------------------------------------------------------------------------------------------
# Recording one cell
# --------------------------------------------------------------------------------------------
def tracer_for(cuda: FakeCuda) -> CellTracer:
    return CellTracer(TorchDebug({"torch": fake_torch(cuda)}))


def test_tracing_never_starts_cuda_and_says_what_to_do():
    cuda = FakeCuda(initialized=False)
    why = tracer_for(cuda).start()
    assert "never starts it" in why and "untraced" in why
    assert cuda.calls == [] and not cuda.initialized


def test_tracing_under_cuda_malloc_async_says_it_cannot():
    cuda = FakeCuda(initialized=True, backend="cudaMallocAsync")
    why = tracer_for(cuda).start()
    assert "cudaMallocAsync" in why and "native" in why
    assert not any(c.startswith("record_memory_history") for c in cuda.calls)


def test_our_recording_is_switched_on_for_the_cell_and_off_after():
    cuda = FakeCuda(initialized=True)
    t = tracer_for(cuda)
    assert t.start() == ""
    assert cuda.history == "all"
    x = cuda.tensor(GiB)
    result = t.stop()
    assert cuda.history is None  # off again: the user had it off
    assert [c for c in cuda.calls if c.startswith("record")] == [
        "record_memory_history('all')", "record_memory_history(None)"]
    assert result.devices[0].alive_at_end[0].nbytes == GiB
    assert result.added_s < hang_guard(0.05)
    del x


def test_the_time_tracing_adds_is_split_into_torchs_calls_and_our_own_analysis():
    # On the H200, torch's snapshot alone took 3.6 s: the report must say whose time it is.
    cuda = FakeCuda(initialized=True)
    now = [0.0]
    torch = TorchDebug({"torch": fake_torch(cuda)})
    real_snapshot, real_record = torch.memory_snapshot, torch.record_history

    def slow_snapshot() -> Any:
        now[0] += 3.6
        return real_snapshot()

    def slow_record(enabled: bool, **kw: Any) -> str:
        now[0] += 0.002
        return real_record(enabled, **kw)

    torch.memory_snapshot = slow_snapshot  # type: ignore[method-assign]
    torch.record_history = slow_record  # type: ignore[method-assign]
    t = CellTracer(torch, clock=lambda: now[0] + time.perf_counter())
    assert t.start() == ""
    x = cuda.tensor(GiB)
    r = t.stop()
    assert abs(r.snapshot_s - 3.6) < 0.01 and abs(r.switch_s - 0.004) < 0.001
    assert r.added_s >= r.torch_s and r.ours_s < hang_guard(0.05)
    footer = TraceReport(r).footer()
    assert "PyTorch's snapshot 3600." in footer and "gpumem_nb's analysis" in footer
    del x


def test_a_recording_the_user_already_had_is_read_and_left_running():
    cuda = FakeCuda(initialized=True)
    cuda.memory._record_memory_history("all", max_entries=1000)
    earlier = cuda.tensor(2 * GiB)  # before the cell: not this cell's
    cuda.calls.clear()
    t = tracer_for(cuda)
    time.sleep(0.002)
    assert t.start() == ""
    mine = cuda.tensor(GiB)
    result = t.stop()
    assert cuda.history == "all" and len(cuda.traces[0]) == 2  # untouched, not cleared
    assert not any(c.startswith("record") for c in cuda.calls)
    assert [s.nbytes for s in result.devices[0].alive_at_end] == [GiB]
    assert any("already on" in n for n in result.notes)
    del earlier, mine


def test_a_later_cell_under_a_running_recording_counts_only_its_own_entries():
    """The history also holds the earlier cells' entries (a recording left on): none of
    them is this cell's, not in the entry count, the peak, the sites or the timeline, and
    freeing an earlier cell's tensor takes nothing off this cell's bytes."""
    cuda = FakeCuda(initialized=True)
    cuda.memory._record_memory_history("all", max_entries=1000)
    big = cuda.tensor(4 * GiB)  # an earlier cell's peak, freed before the traced cell
    del big
    kept = cuda.tensor(GiB)  # an earlier cell's, freed inside the traced cell
    before = len(cuda.traces[0])
    t = tracer_for(cuda)
    time.sleep(0.002)
    assert t.start() == ""
    del kept
    mine = cuda.tensor(512 * MiB)
    result = t.stop()
    d = result.devices[0]
    assert len(cuda.traces[0]) - before == 3 == result.entries == d.entries
    assert d.allocations == 1 and d.peak_bytes == d.end_bytes == 512 * MiB
    assert [s.nbytes for s in d.at_peak] == [s.nbytes for s in d.alive_at_end] == [512 * MiB]
    assert max(sum(s.mib[i] for s in d.series) for i in range(len(d.times_ms))) == 512
    assert min(d.times_ms) >= 0  # drawn from the cell's start, not the earlier entries'
    assert "gpumem --trace: 3 history entries" in TraceReport(result).footer()
    del mine


def test_builds_with_only_the_legacy_signature_are_still_recorded():
    cuda = FakeCuda(initialized=True)
    seen: list[tuple[Any, ...]] = []

    def legacy(enabled: Any, record_context: bool = True, trace_alloc_max_entries: int = 1,
               trace_alloc_record_context: bool = False) -> None:
        seen.append((enabled, trace_alloc_max_entries, trace_alloc_record_context))

    cuda.memory._record_memory_history = legacy  # type: ignore[method-assign]
    assert TorchDebug({"torch": fake_torch(cuda)}).record_history(True, max_entries=77) == ""
    assert seen == [(True, 77, True)]


def test_a_full_history_buffer_is_reported():
    cuda = FakeCuda(initialized=True)
    t = CellTracer(TorchDebug({"torch": fake_torch(cuda)}), max_entries=4)
    t.start()
    keep = [cuda.tensor(MiB) for _ in range(6)]
    result = t.stop()
    assert any("buffer filled up" in n for n in result.notes)
    del keep


# --------------------------------------------------------------------------------------------
# The cell magic
# --------------------------------------------------------------------------------------------
def test_traced_cell_lists_the_line_that_allocated_most_and_saves_a_protocol_4_snapshot(
        loaded, fake_gpu, tmp_path, capsys):
    path = tmp_path / "cell.pickle"
    loaded.run_cell(
        f"%%gpumem --trace --top 2 --save {path}\n"
        "a = cuda.tensor(256 * MiB)\n"
        "b = cuda.tensor(GiB)\n"
        "del b\n"
        "def helper():\n"
        "    return cuda.tensor(64 * MiB)\n"
        "c = helper()\n", store_history=True)
    out = capsys.readouterr().out
    print(out)
    assert "top sites at the cell's peak (1.25 GiB" in out
    peak_rows = out.split("top sites at the cell's peak")[1].split("still alive")[0]
    first = next(ln for ln in peak_rows.splitlines() if "cell line" in ln)
    assert "1.00 GiB" in first and "cell line 2: b = cuda.tensor(GiB)" in first
    alive = out.split("still alive at the end")[1]
    assert "cell line 1: a = cuda.tensor(256 * MiB)" in alive
    assert "cell line 5 in helper: return cuda.tensor(64 * MiB)  (from cell line 6)" in alive
    assert "pickle protocol 4" in out and "tracing added" in out
    raw = path.read_bytes()
    assert raw[:2] == b"\x80\x04"  # protocol 4: what memory_viz can read
    snap = pickle.loads(raw)
    assert {"segments", "device_traces"} <= set(snap)
    assert fake_gpu.cuda.history is None  # switched off again
    del loaded.user_ns["a"], loaded.user_ns["c"]


def test_trace_o_returns_the_report_with_the_cell_measurement(loaded):
    loaded.run_cell("%%gpumem --trace -o -q\nx = cuda.tensor(GiB)", store_history=True)
    report = loaded.user_ns["_"]
    assert isinstance(report, TraceReport)
    assert report.result.devices[0].at_peak[0].nbytes == GiB
    assert report.cell.peak_allocated_bytes is not None
    assert "still alive at the end" in report._repr_html_()


def test_top_and_save_need_trace(loaded):
    with pytest.raises(UsageError, match="go with --trace"):
        loaded.run_cell_magic("gpumem", "--top 3", "x = 1")
    with pytest.raises(UsageError, match="positive"):
        loaded.run_cell_magic("gpumem", "--trace --top 0", "x = 1")


def test_an_oom_in_a_traced_cell_lists_the_sites_live_at_the_failure(loaded, capsys):
    loaded.run_cell("%%gpumem --trace\nw = cuda.tensor(60 * GiB)\nv = cuda.tensor(20 * GiB)\n"
                    "x = cuda.tensor(100 * GiB)", store_history=True)
    out = capsys.readouterr().out
    assert out.count("gpumem: CUDA out of memory") == 1
    e = current_monitor(loaded).oom.last
    assert [(s.label.split(":")[0], s.nbytes) for s in e.sites_at_failure] == [
        ("cell line 1", 60 * GiB), ("cell line 2", 20 * GiB)]
    assert "Live at the failure (from --trace)" in out
    assert "live when it ran out of memory (asked 100.00 GiB)" in out


def test_a_trace_before_cuda_starts_runs_the_cell_untraced_and_says_why(shell, no_gpu, capsys):
    fake = FakeCuda(initialized=False)
    sys.modules["torch"] = fake_torch(fake)
    try:
        shell.run_cell("%load_ext gpumem_nb", store_history=True)
        capsys.readouterr()
        shell.run_cell("%%gpumem --trace\ny = 41 + 1", store_history=True)
        out = capsys.readouterr().out
        assert "CUDA is not initialized yet" in out and shell.user_ns["y"] == 42
        assert not fake.initialized and fake.calls == []
    finally:
        del sys.modules["torch"]


def test_saving_into_a_missing_directory_is_refused_before_the_cell_runs(loaded):
    target = os.path.join("/nonexistent-dir", "x.pickle")
    with pytest.raises(UsageError, match="directory that does not exist"):
        loaded.run_cell_magic("gpumem", f"--trace --save {target}", "x = cuda.tensor(MiB)")
    assert "x" not in loaded.user_ns


def test_a_save_that_fails_at_the_end_is_a_note_not_a_lost_report(loaded, tmp_path,
                                                                   monkeypatch, capsys):
    target = tmp_path / "x.pickle"
    target.write_bytes(b"the previous snapshot")

    def disk_full(obj: Any, f: Any, protocol: int) -> None:
        f.write(b"\x80\x04partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pickle, "dump", disk_full)
    loaded.run_cell(f"%%gpumem --trace --save {target}\nx = cuda.tensor(MiB)",
                    store_history=True)
    out = capsys.readouterr().out
    assert "Could not write" in out and "No space left" in out and "top sites" in out
    assert target.read_bytes() == b"the previous snapshot"  # not truncated to nothing
    assert [p.name for p in tmp_path.iterdir()] == ["x.pickle"]  # no temporary file left


# --------------------------------------------------------------------------------------------
# Offline rendering in JupyterLab (browser marker: needs Debian's chromium, see README)
# --------------------------------------------------------------------------------------------
TIMELINE_CELL = '''\
from gpumem_nb.trace import TraceTimeline, analyze
MiB = 2**20
def alloc(addr, size, t, line):
    return {"action": "alloc", "addr": addr, "size": size, "time_us": t,
            "frames": [{"filename": "<ipython-input-1-0123456789ab>", "line": line,
                        "name": "<module>"}]}
entries = [alloc(1, 256 * MiB, 1000, 1), alloc(2, 1024 * MiB, 2000, 2),
           {"action": "free_requested", "addr": 2, "size": 1024 * MiB, "time_us": 3000},
           alloc(3, 64 * MiB, 4000, 3)]
TraceTimeline(analyze(entries))'''


@pytest.mark.browser
def test_the_timeline_draws_in_jupyterlab_with_no_network_and_again_from_the_saved_file(
        tmp_path):
    import nbformat

    from .browser_harness import chromium, run_cell, running_lab

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(TIMELINE_CELL)]
    outside: list[str] = []
    with running_lab(tmp_path) as lab, chromium() as browser:
        nbformat.write(nb, lab.root / "trace.ipynb")
        page = browser.new_page(viewport={"width": 1200, "height": 900})

        def only_local(route: Any) -> None:
            if route.request.url.startswith(lab.base):
                route.continue_()
            else:  # a CDN, or anything else: offline means none of it
                outside.append(route.request.url)
                route.abort()

        page.route("**/*", only_local)
        url = f"{lab.base}/lab/tree/trace.ipynb?token={lab.token}"
        page.goto(url)
        page.wait_for_selector("text=Python 3 (ipykernel) | Idle", timeout=90_000)
        drawn = ("() => { const p = document.querySelector('.js-plotly-plot');"
                 " return p && p.data ? p.data.map(t => t.name) : null; }")
        for attempt in range(3):
            run_cell(page, 0, wait=False)  # the first may be dropped: retried
            try:
                page.wait_for_function(drawn, timeout=30_000)
                break
            except Exception:
                if attempt == 2:
                    raise
        names = page.evaluate(drawn)
        # The plotly renderer adds its PNG to the output a moment after drawing:
        # save until the file holds it (or 30 s pass; the assertion below then says so).
        for _ in range(30):
            page.keyboard.press("Control+s")
            page.wait_for_timeout(1000)
            on_disk = nbformat.read(lab.root / "trace.ipynb", as_version=4)
            outs = on_disk.cells[0].get("outputs", [])
            if outs and "image/png" in outs[0].get("data", {}):
                break
        page.goto(url)  # the saved file, not re-run
        # Reopened, the output is drawn again: interactively when the notebook is
        # trusted, else from the PNG the plotly renderer stored beside the figure.
        shown = ("() => { const p = document.querySelector('.js-plotly-plot');"
                 " if (p && p.data) return 'plotly';"
                 " const i = document.querySelector('.jp-OutputArea-output img');"
                 " return i && i.src.startsWith('data:image/png') ? 'png' : null; }")
        page.wait_for_function(shown, timeout=60_000)
        again = page.evaluate(shown)
    assert [n.split(":")[0] for n in names] == ["cell line 2", "cell line 1", "cell line 3"]
    print("reopened as:", again)
    assert again in ("plotly", "png")
    saved = nbformat.read(tmp_path / "nb" / "trace.ipynb", as_version=4)  # lab.root
    data = saved.cells[0].outputs[0]["data"]
    assert {"application/vnd.plotly.v1+json", "image/png", "text/html"} <= set(data)
    assert outside == [], outside


def test_a_time_no_clock_gives_is_skipped_not_drawn_as_a_duration():
    # The review's t8: a time_us of 1e18 gave "over 998203848539549.9 ms".
    entries = [alloc(1, MiB, 1_000_000.0, 1), alloc(2, MiB, 1e18, 2),
               alloc(3, MiB, 1_000_010.0, 3)]
    d = trace.analyze(entries)
    assert d.skipped == 1 and d.allocations == 2
    assert max(d.times_ms) < 1.0


# --------------------------------------------------------------------------------------------
# Each line labelled as written: the compiler's line numbers, not str.splitlines()'s
# --------------------------------------------------------------------------------------------
def _traced_labels(shell: Any, body: str) -> dict[int, str]:
    """The traced cell's sites still alive at its end, by cell line number."""
    shell.run_cell("%%gpumem --trace -q --top 20\n" + body, store_history=True)
    traced = current_monitor(shell).last_trace
    assert traced is not None
    return {sb.site.line: sb.label for d in traced.devices for sb in d.alive_at_end}


def _clear_user(shell: Any, *names: str) -> None:
    for name in names:
        shell.user_ns.pop(name, None)


def test_a_traced_line_after_a_u2028_in_a_string_is_not_labelled_with_the_line_before(loaded):
    labels = _traced_labels(loaded, "a1 = cuda.tensor(64 * MiB); s = '\u2028'\n"
                                    "b2 = cuda.tensor(32 * MiB)\n"
                                    "c3 = cuda.tensor(16 * MiB)\n")
    assert labels[1] == "cell line 1: a1 = cuda.tensor(64 * MiB); s = '\u2028'"
    assert labels[2] == "cell line 2: b2 = cuda.tensor(32 * MiB)"
    assert labels[3] == "cell line 3: c3 = cuda.tensor(16 * MiB)"
    _clear_user(loaded, "a1", "b2", "c3", "s")


def test_a_traced_line_after_a_nel_in_a_comment_is_not_labelled_with_the_comments_tail(loaded):
    labels = _traced_labels(loaded, "a1 = cuda.tensor(64 * MiB)  # x\x85y\n"
                                    "b2 = cuda.tensor(32 * MiB)\n")
    assert labels[1] == "cell line 1: a1 = cuda.tensor(64 * MiB)  # x\x85y"
    assert labels[2] == "cell line 2: b2 = cuda.tensor(32 * MiB)"
    _clear_user(loaded, "a1", "b2")


def test_a_traced_line_after_a_vertical_tab_in_a_string_is_not_labelled_with_the_string(
        loaded):
    labels = _traced_labels(loaded, "a1 = cuda.tensor(64 * MiB); s = 'x\x0by'\n"
                                    "b2 = cuda.tensor(32 * MiB)\n")
    assert labels[2] == "cell line 2: b2 = cuda.tensor(32 * MiB)"
    _clear_user(loaded, "a1", "b2", "s")


def test_a_traced_cell_with_windows_line_ends_counts_each_crlf_as_one_line(loaded):
    labels = _traced_labels(loaded, "a1 = cuda.tensor(64 * MiB)\r\n"
                                    "\r\n"
                                    "b2 = cuda.tensor(32 * MiB)\r\n")
    assert labels == {1: "cell line 1: a1 = cuda.tensor(64 * MiB)",
                      3: "cell line 3: b2 = cuda.tensor(32 * MiB)"}
    _clear_user(loaded, "a1", "b2")


def test_lines_in_an_earlier_cell_and_a_module_keep_their_own_labels_beside_a_u2028_cell(
        loaded, tmp_path, monkeypatch):
    # A function from an earlier cell is labelled from that cell's own text, one from a
    # module from its own file, as before.
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "blocks.py").write_text("def build(cuda, MiB):\n"
                                   "    return cuda.tensor(4 * MiB)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    loaded.run_cell("# an earlier cell\n"
                    "def make():\n"
                    "    return cuda.tensor(8 * MiB)\n", store_history=True)
    labels = _traced_labels(loaded, "s = '\u2028'\n"
                                    "from mypkg.blocks import build\n"
                                    "m = make()\n"
                                    "b = build(cuda, MiB)\n")
    assert labels[3] == "cell line 3 in make: return cuda.tensor(8 * MiB)  (from cell line 3)"
    assert labels[2] == "mypkg/blocks.py:2 in build: return cuda.tensor(4 * MiB)  " \
                        "(from cell line 4)"
    _clear_user(loaded, "s", "build", "m", "b", "make")
    sys.modules.pop("mypkg.blocks", None)
    sys.modules.pop("mypkg", None)


def test_a_traced_cell_leaves_no_input_transformer_behind(loaded):
    before = list(loaded.input_transformers_post)
    loaded.run_cell("%%gpumem --trace -q\nx = cuda.tensor(MiB)\n", store_history=True)
    loaded.run_cell("%%gpumem --trace -q\nraise ValueError('the body failed')\n",
                    store_history=True)
    assert loaded.input_transformers_post == before
    _clear_user(loaded, "x")


def test_a_traced_line_holding_a_noncharacter_or_a_bidi_override_is_shown_escaped(loaded):
    from gpumem_nb import trace

    loaded.run_cell("%%gpumem --trace -q\n"
                    "a1 = cuda.tensor(64 * MiB); s = '\ufffe\u202e'\n", store_history=True)
    report = trace.views(current_monitor(loaded).last_trace)[0]
    for text in (str(report), report._repr_html_()):
        assert "\\ufffe\\u202e" in text
        assert "\ufffe" not in text and "\u202e" not in text
    _clear_user(loaded, "a1", "s")


def _ours(shell: Any) -> list[Any]:
    return [t for t in shell.input_transformers_post
            if getattr(t, "__qualname__", "") == "CompiledTexts._see"]


def test_the_cell_text_transformer_is_one_while_loaded_and_gone_after_unload_and_reload(shell):
    # Observing changes nothing: one transformer while loaded, none after %unload_ext, one
    # again (not two) after %reload_ext, and the lines it is given come back as they were.
    others = [t for t in shell.input_transformers_post if t not in _ours(shell)]
    shell.run_cell("%load_ext gpumem_nb", store_history=False)
    (hook,) = _ours(shell)
    lines = ["a = 1\n", "b = 2\n"]
    assert hook(lines) is lines and lines == ["a = 1\n", "b = 2\n"]
    shell.run_cell("%reload_ext gpumem_nb", store_history=False)
    assert len(_ours(shell)) == 1 and _ours(shell)[0] is not hook
    shell.run_cell("%unload_ext gpumem_nb", store_history=False)
    assert _ours(shell) == []
    assert shell.input_transformers_post == others


def test_a_rebound_transformer_list_loses_the_transformer_at_unload(shell):
    original = shell.input_transformers_post
    shell.run_cell("%load_ext gpumem_nb", store_history=False)
    try:
        shell.run_cell("ip = get_ipython()\n"
                       "ip.input_transformers_post = list(ip.input_transformers_post)\n",
                       store_history=False)
        rebound = shell.input_transformers_post
        shell.run_cell("%unload_ext gpumem_nb", store_history=False)
        assert _ours(shell) == [] and rebound is shell.input_transformers_post
        assert not any(getattr(t, "__qualname__", "") == "CompiledTexts._see"
                       for t in original)
    finally:
        shell.input_transformers_post = original
        shell.user_ns.pop("ip", None)


def test_the_cell_text_store_keeps_the_last_cells_and_skips_huge_ones():
    from gpumem_nb.celltext import CellTexts

    store = CellTexts(max_texts=3, max_text_chars=10, max_total_chars=25)
    for text in ("a = 1\n", "b = 2\n", "c = 3\n", "d = 4\n"):
        store.add_lines([text])
    assert store.reader().texts == ("b = 2\n", "c = 3\n", "d = 4\n")  # the oldest went
    store.add_lines(["b = 2\n"])  # seen again: now the newest, kept once
    assert store.reader().texts == ("c = 3\n", "d = 4\n", "b = 2\n")
    store.add_lines(["x" * 11])  # over the per-text bound: not kept, nothing evicted
    assert len(store) == 3
    store.add_lines(["y" * 10, "\n"][:1])
    store.add_lines(["z" * 10])
    assert store._chars <= 25 and store.reader().texts[-1] == "z" * 10


def test_cell_text_reads_no_file_but_the_cell_it_was_compiled_as():
    import linecache

    from gpumem_nb.celltext import CellText, compiler_lines

    text = "a = '\u2028'\r\nb = 1\rc = 2\n"
    assert compiler_lines(text) == ["a = '\u2028'", "b = 1", "c = 2", ""]
    name = "<ipython-input-99-celltexttest>"
    linecache.cache[name] = (len(text), None, [ln + "\n" for ln in text.splitlines()], name)
    try:
        cell = CellText(text)
        assert cell.line(name, 2) == "b = 1" and cell.line(name, 3) == "c = 2"
        assert cell.line(name, 40) == ""
        assert cell.line("<ipython-input-98-other>", 2) is None  # another cell: linecache's
        assert CellText("a = 1\n").line(name, 1) is None  # another text compiled there
    finally:
        del linecache.cache[name]
