"""``%gpumem whatif`` on a traced cell, its errors, the public ``gpumem_nb.whatif``, and the
OOM explainer's what-if line."""

from __future__ import annotations

import json
from typing import Any

import pytest
from IPython.core.error import UsageError

import gpumem_nb
from gpumem_nb.kernel import current_monitor
from gpumem_nb.whatif import api
from gpumem_nb.whatif.report import WhatIfChart

from .fakes import GiB, MiB
from .helpers import whatif
from .whatif_history import History


def test_whatif_replays_the_last_traced_cell_under_the_current_setting_and_each_conf(
        loaded, capsys):
    loaded.run_cell("%%gpumem --trace -q\na = cuda.tensor(16 * MiB)\nb = cuda.tensor(5 * MiB)\n"
                    "del a\nc = cuda.tensor(30 * MiB)", store_history=True)
    capsys.readouterr()
    r = whatif(loaded, "--conf expandable_segments:True --conf max_split_size_mb:64 -o")
    assert [x.label for x in r] == ["defaults", "expandable_segments:True",
                                    "max_split_size_mb:64"]
    assert r[0].current and r[0].peak_reserved_bytes == (16 + 20 + 30) * MiB
    # Expandable: one segment of 20 MiB pages, 16 + 5 then 30 reusing the first 16 MiB.
    assert r[1].peak_reserved_bytes == 60 * MiB
    assert r.capacity_bytes is not None and r[0].oom is False  # judged at the GPU's free memory
    whatif(loaded, "--conf expandable_segments:True")
    out = capsys.readouterr().out
    assert "expandable_segments:True" in out and "peak reserved" in out and "saving" in out
    del loaded.user_ns["b"], loaded.user_ns["c"]


def test_the_chart_is_plain_plotly_json_with_one_line_per_setting(loaded):
    loaded.run_cell("%%gpumem --trace -q\na = cuda.tensor(16 * MiB)\ndel a", store_history=True)
    r = whatif(loaded, "-o")
    fig = WhatIfChart(r)._repr_mimebundle_()["application/vnd.plotly.v1+json"]
    json.dumps(fig)  # plain data: it travels in the notebook as it is
    names = [d["name"] for d in fig["data"]]
    assert names[0] == "defaults (current)" and len(names) == 1 + len(api.DEFAULT_ALTERNATIVES)
    assert fig["layout"]["shapes"]  # the capacity line


def test_the_chart_draws_the_recorded_allocator_beside_the_predictions():
    h = History()
    h.entries.append({"action": "segment_alloc", "addr": 1, "size": 20 * MiB, "stream": 0,
                      "time_us": 1.0})
    h.alloc(16 * MiB)
    fig = WhatIfChart(api.whatif(h.snapshot(), ["", "expandable_segments:True"])).figure()
    recorded = fig["data"][-1]
    assert recorded["name"].startswith("recorded") and max(recorded["y"]) == 20.0


def test_whatif_reads_a_saved_snapshot_file(loaded, tmp_path):
    path = tmp_path / "cell.pickle"
    loaded.run_cell(f"%%gpumem --trace -q --save {path}\nx = cuda.tensor(40 * MiB)",
                    store_history=True)
    r = whatif(loaded, f"--trace {path} --conf expandable_segments:True --capacity 50MiB -o")
    assert [x.peak_reserved_bytes for x in r] == [40 * MiB, 40 * MiB]
    assert r.capacity_bytes == 50 * 2**20 and r[0].oom is False
    del loaded.user_ns["x"]


@pytest.mark.parametrize(("line", "words"), [
    ("--conf bogus:1", "--conf 'bogus:1': 'bogus' is not an allocator setting"),
    ("--conf max_split_size_mb:4", "must be at least 20"),
    ("--capacity lots", "--capacity: 'lots' is not a size"),
    ("--capacity 0", "above zero"),
    ("--trace /no/such/file.pickle", "cannot read /no/such/file.pickle"),
    ("--device -1", "GPU number"),
])
def test_bad_arguments_are_usage_errors_with_a_plain_sentence(loaded, line, words):
    loaded.run_cell("%%gpumem --trace -q\nx = cuda.tensor(MiB)", store_history=True)
    with pytest.raises(UsageError, match=words.replace("(", r"\(")):
        whatif(loaded, line)


def test_whatif_before_any_traced_cell_says_how_to_get_one(loaded):
    with pytest.raises(UsageError, match="run a cell under %%gpumem --trace first"):
        whatif(loaded, "")


def test_gpumem_nb_whatif_is_the_function_even_after_its_package_is_imported():
    import importlib

    importlib.import_module("gpumem_nb.whatif.api")
    h = History()
    h.alloc(16 * MiB)
    assert callable(gpumem_nb.whatif)
    assert gpumem_nb.whatif(h.snapshot(), [""])[0].peak_reserved_bytes == 16 * MiB


def test_a_traced_oom_says_what_expandable_segments_would_have_done(loaded, capsys):
    loaded.run_cell("%%gpumem --trace\nw = cuda.tensor(60 * GiB)\nv = cuda.tensor(20 * GiB)\n"
                    "x = cuda.tensor(100 * GiB)", store_history=True)
    out = capsys.readouterr().out
    e = current_monitor(loaded).oom.last
    line = next(n for n in e.notes if n.startswith("Replayed under expandable_segments:True"))
    assert "would have peaked at 180.00 GiB reserved (still out of memory" in line
    assert line in out
    assert "extra" in e.stage_s


def test_a_request_larger_than_the_gpu_gets_no_what_if_line_but_keeps_its_table(loaded, capsys):
    # 200 GiB on a 141 GiB H200: more than an expandable segment's address space (9/8 of
    # the GPU). The replay crashed on it (AssertionError), which gave %gpumem whatif a
    # traceback. The explainer says the request is impossible; a line replaying it under
    # another setting only added a larger impossible peak (tutorial 07 at b27572d).
    loaded.run_cell("%%gpumem --trace\nx = cuda.tensor(GiB)\ny = cuda.tensor(200 * GiB)",
                    store_history=True)
    out = capsys.readouterr().out
    e = current_monitor(loaded).oom.last
    assert "Impossible on this GPU" in out
    assert not any(n.startswith("Replayed under") for n in e.notes)
    r = whatif(loaded, "--conf expandable_segments:True -o")
    assert [x.oom for x in r] == [True, True]
    assert all(x.peak_reserved_bytes >= 201 * GiB for x in r)
    del loaded.user_ns["x"]


def test_the_expandable_line_says_fits_when_only_fragmentation_stood_in_the_way():
    # Eight 5 MiB tensors in two 20 MiB segments; all but the first of each freed: 30 MiB
    # free but split, so the native allocator needs a new 30 MiB segment (70 MiB) while
    # expandable segments grow the free tail by one page (60 MiB).
    h = History()
    xs = [h.alloc(5 * MiB) for _ in range(8)]
    for i, x in enumerate(xs):
        if i % 4:
            h.free(x)
    h.alloc(30 * MiB)
    native, = api.whatif(h.snapshot(), [""], capacity_bytes=60 * MiB)
    assert native.oom and native.peak_reserved_bytes == 70 * MiB
    line = api.expandable_oom_line(h.snapshot(), device=0, capacity_bytes=60 * MiB)
    assert line == ("Replayed under expandable_segments:True, this cell alone (nothing was "
                    "reserved before it) would have peaked at 60.00 MiB reserved (fits in "
                    "the 60.00 MiB PyTorch could use).")


def test_the_expandable_line_is_silent_when_expandable_segments_were_already_on():
    h = History(setting="expandable_segments:True")
    h.alloc(5 * MiB)
    assert api.expandable_oom_line(h.snapshot(), device=0, capacity_bytes=GiB) == ""


# ------------------------------------------------------------------------------------------
# What tracing records for the what-if.
# ------------------------------------------------------------------------------------------
def _tracer(cuda: Any) -> Any:
    from gpumem_nb.sources.torch import TorchDebug
    from gpumem_nb.trace import CellTracer

    from .fakes import fake_torch

    return CellTracer(TorchDebug({"torch": fake_torch(cuda)}))


def test_a_trace_starts_with_the_segments_only_snapshot_and_the_gpus_free_memory():
    from .fakes import FakeCuda, FakeGpu

    cuda = FakeCuda(initialized=True)
    cuda.link([FakeGpu("GPU-aaaa-1111")])
    keep = cuda.tensor(64 * MiB)  # existed before the cell: a segment and a context
    t = _tracer(cuda)
    assert t.start() == ""
    # The cheap form, before history is switched on: no traces to gather.
    first = cuda.calls.index("memory_snapshot(include_traces=False)")
    assert first < cuda.calls.index("record_memory_history('all')")
    assert "snapshot" not in cuda.calls[:first + 2]
    x = cuda.tensor(16 * MiB)
    r = t.stop()
    start = r.snapshot["gpumem_start"]
    assert [s["total_size"] for s in start["segments"]] == [64 * MiB]
    assert start["devices"]["0"]["free_bytes"] == cuda.device_free(0) + 16 * MiB
    assert start["devices"]["0"]["total_bytes"] == cuda.devices[0].total
    assert start["since_us"] is None  # our own recording: the whole history is the cell's
    del keep, x


def test_without_a_cheap_segments_snapshot_and_history_on_the_start_is_said_missing():
    from .fakes import FakeCuda

    cuda = FakeCuda(initialized=True)
    del type(cuda.memory).memory_snapshot  # a torch without it (restored below)
    try:
        cuda.memory._record_memory_history("all")  # the user's own recording
        t = _tracer(cuda)
        assert t.start() == ""
        r = t.stop()
        assert any("no start state" in n for n in r.notes)
        assert r.snapshot["gpumem_start"]["segments"] is None
        assert r.snapshot["gpumem_start"]["since_us"] is not None
    finally:
        from . import fakes

        type(cuda.memory).memory_snapshot = fakes._memory_snapshot  # type: ignore[attr-defined]


def test_under_a_memory_fraction_the_line_checks_the_cap_as_the_allocator_does():
    # 100 MiB freed, 30 MiB reusing it (70 stranded natively), then 80 MiB, with 150 MiB
    # allowed: natively 100 + 80 > 150 and nothing can be released; expandable segments
    # unmap the free pages first, then map 80 MiB more (peak 120 MiB).
    h = History()
    h.free(h.alloc(100 * MiB))
    h.alloc(30 * MiB)
    h.alloc(80 * MiB)
    native, = api.run(api.trace_input(h.snapshot()), [api.parse_settings("")],
                      allowed_bytes=150 * MiB)
    assert native.oom
    line = api.expandable_oom_line(h.snapshot(), device=0, capacity_bytes=10 * GiB,
                                   allowed_bytes=150 * MiB)
    assert "peaked at 120.00 MiB reserved (fits in the 150.00 MiB" in line
