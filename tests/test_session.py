"""%gpumem record and %gpumem whatif --session: the whole session's history, replayed from
its recorded start (issue 25), and the first traced snapshot's one-off cost."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
from IPython.core.error import UsageError

from gpumem_nb.kernel import current_monitor
from gpumem_nb.sources.torch import TorchDebug, inductor_lookup_skipped
from gpumem_nb.trace import CellTracer
from tests.fakes import FakeCuda, fake_torch
from tests.helpers import whatif

GiB = 1 << 30
MiB = 1 << 20


def record(ip: Any, line: str) -> None:
    ip.run_line_magic("gpumem", "record " + line)


def test_recording_never_starts_cuda_unless_asked(shell, fake_gpu, capsys):
    fake_gpu.cuda.initialized = False
    shell.run_cell("%load_ext gpumem_nb")
    capsys.readouterr()
    record(shell, "on")
    out = capsys.readouterr().out
    assert "never starts it by itself" in out and "--start-cuda" in out
    assert not fake_gpu.cuda.initialized
    assert not any(c.startswith(("record_memory_history", "init")) for c in fake_gpu.cuda.calls)
    record(shell, "on --start-cuda")
    out = capsys.readouterr().out
    assert "This started CUDA, as you asked" in out and "empty GPU" in out
    assert fake_gpu.cuda.initialized and fake_gpu.cuda.history == "all"
    record(shell, "off")


def test_the_session_replays_every_cell_since_it_began_from_an_empty_gpu(loaded, capsys):
    record(loaded, "on")
    assert "Nothing is reserved yet" in capsys.readouterr().out
    loaded.run_cell("a = cuda.tensor(30 * GiB)")
    loaded.run_cell("b = cuda.tensor(20 * GiB)")
    loaded.run_cell("del a\nc = cuda.tensor(10 * GiB)")
    r = whatif(loaded, "--session --conf expandable_segments:True -o")
    base = r.baseline
    assert base.start_reserved_bytes == 0  # the recorded start: nothing reserved
    # All three cells, not the last one alone: the 30 GiB and the 20 GiB were live together.
    assert base.peak_allocated_bytes == 50 * GiB
    record(loaded, "off")
    assert "kept for %gpumem whatif --session" in capsys.readouterr().out
    # Switched off, the finished session is still there to replay.
    assert whatif(loaded, "--session -o").baseline.peak_allocated_bytes == 50 * GiB
    del loaded.user_ns["b"], loaded.user_ns["c"]


def test_session_without_a_recording_says_how_to_make_one(loaded):
    with pytest.raises(UsageError, match="%gpumem record on"):
        whatif(loaded, "--session")


def test_an_oom_under_a_session_is_replayed_from_the_session_start(loaded, capsys):
    record(loaded, "on")
    loaded.run_cell("w = cuda.tensor(60 * GiB)")
    loaded.run_cell("v = cuda.tensor(20 * GiB)")
    loaded.run_cell("x = cuda.tensor(100 * GiB)", store_history=True)
    e = current_monitor(loaded).oom.last
    line = next(n for n in e.notes if n.startswith("Replayed under expandable_segments:True"))
    assert "from the start of the session recording (an empty GPU)" in line
    assert "the same cells would have peaked at 180.00 GiB reserved (still out of memory" in line
    record(loaded, "off")
    del loaded.user_ns["w"], loaded.user_ns["v"]


def test_a_traced_cell_after_earlier_ones_states_no_outcome_its_start_decides(loaded, capsys):
    # The case: the replay starts from segments the current setting made before the
    # cell, so it cannot say whether a restarted kernel fits, and must not claim it.
    loaded.run_cell("w = cuda.tensor(60 * GiB)")
    loaded.run_cell("%%gpumem --trace\nx = cuda.tensor(100 * GiB)", store_history=True)
    e = current_monitor(loaded).oom.last
    line = next(n for n in e.notes if n.startswith("Replayed under expandable_segments:True"))
    assert "this cell alone, from the 60.00 GiB of segments the current setting made" in line
    assert "no outcome is predicted" in line and "%gpumem record on" in line
    assert "(fits in" not in line and "still out of memory" not in line
    del loaded.user_ns["w"]


def test_a_full_session_buffer_says_entries_were_dropped(loaded, capsys):
    record(loaded, "on --max-entries 4")
    for _ in range(5):
        loaded.run_cell("t = cuda.tensor(MiB)\ndel t")
    r = whatif(loaded, "--session -o")
    assert any("dropped" in n and "cannot start from the recording's start" in n
               for n in r.notes)
    record(loaded, "off")


def test_recording_leaves_a_users_own_history_alone(loaded, capsys):
    sys.modules["torch"].cuda.memory._record_memory_history("all")
    record(loaded, "on")
    assert "already recording (your own" in capsys.readouterr().out
    assert sys.modules["torch"].cuda.history == "all"
    sys.modules["torch"].cuda.memory._record_memory_history(None)


# ------------------------------------------------------------------------------------------
# The first traced snapshot's seconds: torch imports torch._inductor to symbolize frames.
# ------------------------------------------------------------------------------------------
def lazy_torch(cuda: FakeCuda) -> tuple[types.ModuleType, list[str]]:
    """A torch module that imports ``_inductor`` on first attribute access (its module
    ``__getattr__``), and a snapshot that asks for it as combined_traceback.cpp does."""
    mod = types.ModuleType("torch")
    mod.__dict__.update(vars(fake_torch(cuda)))
    imported: list[str] = []

    def lazy(name: str) -> Any:
        if name == "_inductor":
            imported.append(name)  # seconds on the H200
            real = types.ModuleType("torch._inductor")
            real.codecache = types.SimpleNamespace()  # type: ignore[attr-defined]
            mod.__dict__["_inductor"] = real
            return real
        raise AttributeError(name)

    mod.__getattr__ = lazy  # type: ignore[attr-defined]
    snapshot = cuda.memory._snapshot

    def symbolizing_snapshot() -> Any:
        if hasattr(mod, "_inductor"):
            hasattr(mod._inductor, "codecache")
        return snapshot()

    cuda.memory._snapshot = symbolizing_snapshot  # type: ignore[method-assign]
    segments = cuda.memory.memory_snapshot

    def symbolizing_segments(*a: Any, **kw: Any) -> Any:
        # Live blocks allocated while history recorded carry frames: torch symbolizes them.
        if hasattr(mod, "_inductor"):
            hasattr(mod._inductor, "codecache")
        return segments(*a, **kw)

    cuda.memory.memory_snapshot = symbolizing_segments  # type: ignore[method-assign]
    return mod, imported


def test_a_traced_cell_never_makes_torch_import_inductor():
    cuda = FakeCuda(initialized=True)
    mod, imported = lazy_torch(cuda)
    modules = {"torch": mod}
    t = CellTracer(TorchDebug(modules))
    assert t.start() == ""
    x = cuda.tensor(GiB)
    t.stop()
    # A later traced cell, with the first one's tensor still live (its frames listed when
    # the start state is read): on the H200 this one took 4.5 s.
    t = CellTracer(TorchDebug(modules))
    assert t.start() == ""
    y = cuda.tensor(GiB)
    t.stop()
    assert imported == []
    assert "_inductor" not in mod.__dict__  # torch's namespace as it was
    del x, y


def test_the_oom_explainers_snapshot_reads_never_make_torch_import_inductor():
    # H200, tutorial 07 at b27572d: an OOM in a traced cell took 5,229.6 ms to explain (4 ms
    # elsewhere): the observer's and the explanation's segment reads, with history on,
    # symbolized the live blocks' frames and so imported torch._inductor.
    cuda = FakeCuda(initialized=True)
    mod, imported = lazy_torch(cuda)
    src = TorchDebug({"torch": mod})
    x = cuda.tensor(GiB)
    segs, why = src.segments_snapshot()
    snap, why2 = src.memory_snapshot()
    assert why == why2 == "" and segs is not None and snap is not None
    assert imported == [] and "_inductor" not in mod.__dict__
    del x


def test_when_inductor_is_imported_the_snapshot_uses_it_untouched():
    cuda = FakeCuda(initialized=True)
    mod, imported = lazy_torch(cuda)
    real = mod._inductor  # the user's torch.compile imported it
    modules = {"torch": mod, "torch._inductor": real}
    with inductor_lookup_skipped(modules):
        assert mod._inductor is real
    assert imported == ["_inductor"] and mod._inductor is real


def test_a_session_begun_before_the_gpu_had_a_context_still_judges_its_fraction(loaded):
    # On the H200 the session began right after set_per_process_memory_fraction, before any
    # allocation made a context: the start knew neither the GPU's size nor its free memory,
    # so no OOM was judged and the fraction's cap was not modelled.
    cuda = sys.modules["torch"].cuda
    cuda.fraction = 0.1
    assert not cuda.devices[0].context
    record(loaded, "on")
    loaded.run_cell("a = cuda.tensor(10 * GiB)")
    loaded.run_cell("b = cuda.tensor(8 * GiB)")
    r = whatif(loaded, "--session --conf expandable_segments:True -o")
    allowed = int(0.1 * cuda.devices[0].total)
    assert all(row.oom for row in r)  # 18 GiB live past a 14.1 GiB cap, under any setting
    assert r.baseline.peak_allocated_bytes == 18 * GiB > allowed
    record(loaded, "off")
    del loaded.user_ns["a"], loaded.user_ns["b"]


def test_the_session_charts_time_axis_counts_from_the_recording_not_a_cell(loaded, capsys):
    """Browser review 2026-12-05 (09's session what-if): the axis said "ms since the cell
    started" over a replay of many cells; its times count from %gpumem record on."""
    from gpumem_nb.whatif.report import WhatIfChart

    record(loaded, "on")
    loaded.run_cell("a = cuda.tensor(GiB)")
    loaded.run_cell("b = cuda.tensor(GiB)")
    session = WhatIfChart(whatif(loaded, "--session --conf expandable_segments:True -o"))
    loaded.run_cell("%%gpumem --trace\nc = cuda.tensor(GiB)")
    cell = WhatIfChart(whatif(loaded, "--conf expandable_segments:True -o"))
    record(loaded, "off")
    del loaded.user_ns["a"], loaded.user_ns["b"], loaded.user_ns["c"]
    for chart, says in ((session, "ms since the recording began"),
                        (cell, "ms since the cell started")):
        assert chart.figure()["layout"]["xaxis"]["title"]["text"] == says
        assert chart.plot().x_title == says  # the saved picture's axis too


def test_unloading_the_extension_switches_the_session_recording_off(loaded, capsys):
    record(loaded, "on")
    cuda = sys.modules["torch"].cuda
    assert cuda.history == "all"
    loaded.run_cell("%unload_ext gpumem_nb")
    assert cuda.history is None  # no recording left costing every allocation


def test_a_traced_cell_during_the_session_names_the_session_not_your_own_recording(
        loaded, capsys):
    record(loaded, "on")
    loaded.run_cell("%%gpumem --trace\nb = cuda.tensor(GiB)")
    out = capsys.readouterr().out
    assert "The session recording (%gpumem record on) was already on" in out
    assert "Your own allocation-history recording" not in out
    assert sys.modules["torch"].cuda.history == "all"  # the session still records
    record(loaded, "off")
    del loaded.user_ns["b"]


@pytest.mark.parametrize(("line", "words"), [
    ("on --max-entries 0", "between 1 and 1000000"),
    ("on --max-entries -1", "between 1 and 1000000"),
    # 100,000,000 was accepted: a session --session then reads for minutes, in gigabytes.
    ("on --max-entries 100000000", "between 1 and 1000000 (what %gpumem whatif --session "
                                   "replays at most), not 100000000"),
])
def test_max_entries_past_what_the_session_replay_reads_is_refused(loaded, line, words):
    with pytest.raises(UsageError, match=words.replace("(", r"\(").replace(")", r"\)")):
        record(loaded, line)
    assert sys.modules["torch"].cuda.history is None


def test_max_entries_while_recording_says_to_switch_off_first_not_ignored(loaded, capsys):
    record(loaded, "on")
    with pytest.raises(UsageError, match="already on, keeping 100000 events: switch it off "
                                         "first"):
        record(loaded, "on --max-entries 500")
    record(loaded, "on")  # twice, as asked before: said, not refused
    assert "already on" in capsys.readouterr().out
    record(loaded, "off")


def test_reload_ext_while_recording_stops_it_and_keeps_the_session_for_replay(loaded, capsys):
    # %reload_ext switched the recording off (as it must) and lost the session with it:
    # "no session recording" right after, the cells' history gone.
    record(loaded, "on")
    loaded.run_cell("a = cuda.tensor(30 * GiB)")
    loaded.run_cell("%reload_ext gpumem_nb")
    assert sys.modules["torch"].cuda.history is None  # nothing of ours keeps recording
    record(loaded, "status")
    assert "a finished session is kept for --session" in capsys.readouterr().out
    assert whatif(loaded, "--session -o").baseline.peak_allocated_bytes == 30 * GiB
    del loaded.user_ns["a"]
