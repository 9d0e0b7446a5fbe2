"""The chart's picture as an output of its own (issue 27: a picture in every export).

nbconvert's HTML of a notebook that holds widget state writes, for an output with a widget view
whose model is in that state, only the widget's script tag: the rest of that output's bundle
(the picture) is dropped. So ``%gpumem watch`` shows two outputs, the live view and then the
picture, which follows every cell in a kernel (nbclient keeps only what a cell sends before it
is idle). tests/test_browser_export.py checks the result in nbconvert's HTML and JupyterLab.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpumem_nb.kernel import current_monitor

from .test_widget import run

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


class Handle:
    def __init__(self, shown: list[Any], display_id: str) -> None:
        self.shown = shown
        self.display_id = display_id
        self.updates: list[dict[str, Any]] = []

    def update(self, bundle: Any, **kw: Any) -> None:
        assert kw == {"raw": True}
        self.updates.append(bundle)
        self.shown.append(("update", self.display_id, bundle))


@pytest.fixture
def shown(monkeypatch: Any) -> list[Any]:
    """What the chart displays and updates, in order: ("display" | "update", id, bundle)."""
    import gpumem_nb.ipython.commands.watch

    events: list[Any] = []

    def display(bundle: Any, *, raw: bool, display_id: str) -> Handle:
        assert raw
        events.append(("display", display_id, bundle))
        return Handle(events, display_id)

    monkeypatch.setattr(gpumem_nb.ipython.commands.watch, "display", display)
    return events


@pytest.fixture
def in_a_kernel(shell: Any, monkeypatch: Any) -> Any:
    """The shell as ipykernel's is: it has a kernel (the picture follows the cells there).
    Every cell's end redraws here; the throttle has its own test."""
    import gpumem_nb.chart.live
    import gpumem_nb.chart.picture

    monkeypatch.setattr(shell, "kernel", object(), raising=False)
    monkeypatch.setattr(gpumem_nb.chart.picture, "PICTURE_EVERY_S", 0.0)
    return shell


def watch(shell: Any, fake_gpu: Any) -> Any:
    run(shell, "%load_ext gpumem_nb")
    mon = current_monitor(shell)
    mon.sampler.stop()
    shell.user_ns["cuda"] = fake_gpu.cuda
    run(shell, "t = cuda.tensor(3 * 2**30)")
    mon.sampler.tick()
    run(shell, "%gpumem watch")
    return mon.widget


def followers(shell: Any) -> list[Any]:
    return [f for f in shell.events.callbacks["post_run_cell"]
            if getattr(f, "__name__", "") == "after_cell"]


def test_watch_shows_the_view_and_the_picture_as_two_outputs_so_nbconvert_keeps_the_picture(
        shell, fake_gpu, shown):
    w = watch(shell, fake_gpu)
    displays = [e for e in shown if e[0] == "display"]
    assert len(displays) == 2, [e[:2] for e in shown]
    (_, view_id, view), (_, picture_id, picture) = displays
    # The view's output: nothing but the view, and an empty page where it cannot be drawn.
    assert set(view) == {WIDGET_VIEW, "text/html"} and view["text/html"] == ""
    assert view[WIDGET_VIEW]["model_id"] == w.box.model_id
    # The picture's output: no widget view, so nbconvert's HTML keeps its picture.
    assert WIDGET_VIEW not in picture and picture["image/svg+xml"].startswith("<svg")
    html = picture["text/html"]
    assert html.startswith("<div class='gpumem-picture'><style>")
    assert '<img src="data:image/svg+xml;base64,' in html and "<table" in html
    assert "NVML used / total" in picture["text/plain"]
    assert view_id == w.display_id and picture_id == w.picture_id != view_id


def test_in_a_kernel_the_picture_follows_each_cell_and_is_sent_only_when_it_changed(
        in_a_kernel, fake_gpu, shown):
    shell = in_a_kernel
    w = watch(shell, fake_gpu)
    handle = w.picture_handle
    sent = len(handle.updates)
    run(shell, "u = cuda.tensor(5 * 2**30)")
    count = shell.execution_count - 1
    assert len(handle.updates) == sent + 1
    assert f">[{count}]<" in handle.updates[-1]["image/svg+xml"]  # the cell just ended
    assert handle.updates[-1]["text/html"].startswith("<div class='gpumem-picture'>")
    w.picture.after_cell()  # nothing new since: nothing sent
    assert len(handle.updates) == sent + 1
    assert all(e[1] == w.picture_id for e in shown if e[0] == "update")  # never the view


def test_in_a_terminal_the_picture_never_prints_after_every_cell(shell, fake_gpu, shown):
    w = watch(shell, fake_gpu)
    assert not followers(shell)
    run(shell, "x = 1")
    assert not w.picture_handle.updates


def test_ending_the_chart_empties_the_picture_first_and_the_view_becomes_the_picture(
        in_a_kernel, fake_gpu, shown):
    """Never the picture twice on screen, even between the two updates; the saved notebook
    then shows the picture where the chart was, without a widget view."""
    shell = in_a_kernel
    w = watch(shell, fake_gpu)
    del shown[:]
    run(shell, "%gpumem watch --stop")
    updates = [e for e in shown if e[0] == "update"]
    assert [e[1] for e in updates] == [w.picture_id, w.display_id], [e[:2] for e in shown]
    assert updates[0][2] == {"text/html": ""}
    assert WIDGET_VIEW not in updates[1][2] and "<img" in updates[1][2]["text/html"]
    assert not followers(shell)  # and nothing left hooked on the cells


def test_reload_ext_leaves_no_picture_hook_on_the_cells(in_a_kernel, fake_gpu, shown):
    shell = in_a_kernel
    watch(shell, fake_gpu)
    assert len(followers(shell)) == 1
    run(shell, "%reload_ext gpumem_nb")
    assert not followers(shell)
    run(shell, "%gpumem watch")
    assert len(followers(shell)) == 1  # the new chart's, once however often it is shown
    run(shell, "%gpumem watch")
    assert len(followers(shell)) == 1


def test_a_picture_that_cannot_be_drawn_stops_following_without_a_traceback_per_cell(
        in_a_kernel, fake_gpu, shown, capsys, caplog):
    shell = in_a_kernel
    w = watch(shell, fake_gpu)
    capsys.readouterr()

    def broken() -> Any:
        raise RuntimeError("no picture")

    w.plain_bundle = broken
    for _ in range(3):
        assert run(shell, "y = 2").success
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err and "Error in callback" not in out.err
    assert not followers(shell)
    assert sum("stopped following" in r.getMessage() for r in caplog.records) == 1


def test_cells_back_to_back_do_not_each_pay_a_redraw_and_the_sampler_catches_up(
        shell, fake_gpu, shown, monkeypatch):
    # Drawing the picture costs about 3 ms, thirty times the hooks' whole per-cell budget: on
    # the main thread it is redrawn at most once per PICTURE_EVERY_S, and a cell that ended
    # sooner is drawn by the sampler thread afterwards, so the picture still ends up current.
    import gpumem_nb.chart.live
    import gpumem_nb.chart.picture

    monkeypatch.setattr(shell, "kernel", object(), raising=False)
    monkeypatch.setattr(gpumem_nb.chart.picture, "PICTURE_EVERY_S", 3600.0)
    w = watch(shell, fake_gpu)
    drawn: list[int] = []
    real = w.picture.bundle

    def counted() -> Any:
        drawn.append(1)
        return real()

    w.picture.bundle = counted
    for i in range(5):
        run(shell, f"z{i} = cuda.tensor(2**30)")
    # The watch cell's own end drew it; these five only marked it stale.
    assert drawn == [] and w.picture.dirty
    monkeypatch.setattr(gpumem_nb.chart.picture, "PICTURE_EVERY_S", 0.0)
    current_monitor(shell).sampler.tick()  # the sampler thread's next sample
    assert len(drawn) == 1 and not w.picture.dirty


# --------------------------------------------------------------------------------------------
# A picture that cannot be drawn (tried as a new user, t27b): in a real kernel a warning's
# traceback lands in the user's cell, a watch whose picture failed raised, and a chart ending
# without a picture emptied the last one it had, leaving the export with none at all.
# --------------------------------------------------------------------------------------------
def broken(*_: Any, **__: Any) -> Any:
    raise RuntimeError("no picture")


def test_a_picture_that_stops_drawing_says_so_in_a_sentence_not_a_traceback_in_the_cell(
        in_a_kernel, fake_gpu, shown, caplog):
    # ipykernel's logging prints a record's exc_info into the cell's output: a traceback.
    shell = in_a_kernel
    w = watch(shell, fake_gpu)
    w.plain_bundle = broken
    assert run(shell, "y = 2").success
    said = [r for r in caplog.records if r.levelno >= 30]
    assert [r.exc_info for r in said] == [None], [r.getMessage() for r in said]
    assert "no picture" in said[0].getMessage()


def test_a_watch_whose_picture_cannot_be_drawn_still_shows_the_live_chart_without_an_error(
        in_a_kernel, fake_gpu, shown, monkeypatch, caplog):
    import gpumem_nb.chart.picture
    import gpumem_nb.chart.still

    monkeypatch.setattr(gpumem_nb.chart.still, "svg_static_bundle", broken)
    shell = in_a_kernel
    run(shell, "%load_ext gpumem_nb")
    result = run(shell, "%gpumem watch")
    assert result.success, result.error_in_exec
    w = current_monitor(shell).widget
    displays = [e for e in shown if e[0] == "display"]
    assert [e[1] for e in displays] == [w.display_id]  # the view; no picture to show
    assert WIDGET_VIEW in displays[0][2]
    assert not followers(shell)  # nothing to redraw after each cell
    assert [r.exc_info for r in caplog.records if r.levelno >= 30] == [None]
    assert run(shell, "%gpumem watch --stop").success
    # The view's output ends as text: no widget view left to read "model not found".
    ended = [e for e in shown if e[0] == "update"][-1]
    assert ended[1] == w.display_id and WIDGET_VIEW not in ended[2]
    assert ended[2]["text/plain"] == gpumem_nb.chart.picture.ENDED_UNDRAWN


def test_a_chart_ending_without_a_new_picture_keeps_its_last_picture_so_the_export_shows_one(
        in_a_kernel, fake_gpu, shown, monkeypatch):
    import gpumem_nb.chart.picture
    import gpumem_nb.chart.still

    shell = in_a_kernel
    w = watch(shell, fake_gpu)
    last = w.picture_handle.updates[-1] if w.picture_handle.updates else None
    monkeypatch.setattr(gpumem_nb.chart.still, "svg_static_bundle", broken)
    del shown[:]
    assert run(shell, "%gpumem watch --stop").success
    # The picture's output is left as it was drawn (never emptied), and the view's output
    # shows no chart, so the rule that hid the picture beside it no longer matches.
    assert [e[1] for e in shown if e[0] == "update"] == [w.display_id], [e[:2] for e in shown]
    ended = shown[-1][2]
    assert WIDGET_VIEW not in ended and "gpumem-live" not in ended.get("text/html", "")
    assert last is None or "<img" in last["text/html"]
