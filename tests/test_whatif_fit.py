"""%gpumem whatif --fit and gpumem_nb.whatif(fit=...): the smallest memory each setting needs,
the GPU-size rows, and a memory fraction modelled once the GPU's size is given (issue 25)."""

from __future__ import annotations

import pickle

import pytest
from IPython.core.error import UsageError

from gpumem_nb.kernel import current_monitor
from gpumem_nb.units import format_bytes
from gpumem_nb.whatif import api as w
from gpumem_nb.whatif.allocator import Limits
from gpumem_nb.whatif.fit import CONTEXT_BYTES, DRIVER_RESERVE_BYTES, Fit, GiB, usable_bytes
from gpumem_nb.whatif.replay import compile_trace, replay
from tests.helpers import whatif
from tests.whatif_history import History

MiB = 1 << 20
NATIVE, EXPANDABLE = "", "expandable_segments:True"


def fragmented() -> History:
    # Eight 5 MiB tensors in 20 MiB segments, all but every fourth freed, then 30 MiB: the
    # native allocator needs a new segment, expandable segments grow the free tail.
    h = History()
    xs = [h.alloc(5 * MiB) for _ in range(8)]
    for i, x in enumerate(xs):
        if i % 4:
            h.free(x)
    h.alloc(30 * MiB)
    return h


def runs_out(h: History, setting: str, room: int) -> bool:
    ti = w.trace_input(h.snapshot())
    r = replay(compile_trace(ti.entries), w.parse_settings(setting),
               limits=Limits(allowed_bytes=room, capacity_bytes=room), start_segments=[])
    return bool(r.oom)


@pytest.mark.parametrize("setting", [NATIVE, EXPANDABLE])
def test_the_minimum_found_fits_and_a_little_less_runs_out(setting):
    h = fragmented()
    r = w.whatif(h.snapshot(), [setting], fit=True)
    need = r.fit.rows[0].min_bytes
    assert need is not None and not runs_out(h, setting, need)
    assert runs_out(h, setting, need - 2 * MiB)


def test_a_run_that_needs_more_room_than_its_unlimited_peak_still_gets_its_minimum():
    # Under a cap the 30 MiB request is checked whole (40 MiB held + 30 MiB) before the
    # expandable segment maps the one page it needs: the unlimited peak, 60 MiB, runs out.
    # The search started at that peak and gave no minimum (a workload on the H200 too).
    h = fragmented()
    r = w.whatif(h.snapshot(), [EXPANDABLE], fit=True)
    need = r.fit.rows[0].min_bytes
    assert r[0].peak_reserved_bytes == 60 * MiB and runs_out(h, EXPANDABLE, 61 * MiB)
    assert need is not None and need > 60 * MiB and not runs_out(h, EXPANDABLE, need)


def test_the_gpu_size_rows_and_the_sentence_name_the_cheapest_setting_that_fits():
    h = History()
    h.alloc(30 * GiB)
    r = w.whatif(h.snapshot(), [NATIVE], fit=40)
    headers, rows = r.fit.gpu_table()
    assert headers[2:] == ("24 GB", "40 GB", "48 GB", "80 GB", "94 GB", "141 GB")
    assert rows[0][2:] == ["no", "yes", "yes", "yes", "yes", "yes"]
    assert r.fit.sentence() == ("On a 40 GB GPU (38.90 GiB for PyTorch) defaults fits and "
                                "needs the least, 30.00 GiB.")
    assert "no setting tried fits" in r.fit.sentence(24)
    assert usable_bytes(24) == 24 * GiB - DRIVER_RESERVE_BYTES - CONTEXT_BYTES


def test_fit_through_the_magic(loaded, capsys):
    loaded.run_cell("%%gpumem --trace -q\nx = cuda.tensor(3 * GiB)")
    whatif(loaded, "--fit 24 --conf expandable_segments:True")
    out = capsys.readouterr().out
    assert "Smallest memory each setting needs" in out and "On a 24 GB GPU" in out
    with pytest.raises(UsageError, match="--fit takes a GPU size in GB"):
        whatif(loaded, "--fit lots")
    del loaded.user_ns["x"]


def test_a_fraction_in_a_dump_snapshot_pickle_is_modelled_once_the_gpu_size_is_given():
    # _dump_snapshot's file does not say how large the GPU is: the fraction was "ignored"
    # even with the capacity passed.
    h = History()
    h.alloc(60 * GiB)
    snap = h.snapshot(recorded_start=False)
    setting = "per_process_memory_fraction:0.5"
    ignored, = w.whatif(snap, [setting])
    assert ignored.oom is None and "ignored" in ignored.note
    modelled, = w.whatif(snap, [setting], total_bytes=100 * GiB)
    assert modelled.oom is True and "ignored" not in modelled.note


def test_a_history_without_segment_entries_says_its_own_reserved_is_unknown():
    h = History()
    h.alloc(16 * MiB)
    r = w.whatif(h.snapshot(recorded_start=False), [NATIVE])
    assert "what its own allocator reserved is unknown" in r.footer()
    assert "0 B reserved" not in r.footer()


def test_a_row_that_runs_out_says_what_its_peak_is():
    # The review's case: --capacity showed a peak above the capacity with no word on it.
    h = History()
    h.alloc(60 * MiB)
    h.alloc(60 * MiB)
    r, = w.whatif(h.snapshot(), [NATIVE], capacity_bytes=100 * MiB)
    assert r.oom and r.peak_reserved_bytes > 100 * MiB
    assert "Ran out of memory at" in r.note and "as if it had been given" in r.note


def test_a_gpu_size_the_recording_contradicts_is_said_unused_not_dropped_silently():
    # A session or traced cell knows its GPU: --gpu 80GiB on it used to change nothing and
    # say nothing, so "OOM judged at 139.91 GiB" read as the answer for an 80 GB GPU.
    h = History()
    h.alloc(30 * GiB)
    snap = h.snapshot(start={"segments": [], "devices": {"0": {
        "free_bytes": 140 * GiB, "total_bytes": 141 * GiB, "fraction": 1.0}}})
    r = w.whatif(snap, [NATIVE], total_bytes=80 * GiB)
    assert any("80.00 GiB, --gpu or total_bytes=) is not used: the recording says GPU 0 has "
               "141.00 GiB" in n for n in r.notes)
    same = w.whatif(snap, [NATIVE], total_bytes=141 * GiB)
    assert not any("is not used" in n for n in same.notes)


def test_the_fit_sentence_names_the_cheapest_then_what_else_fits_and_what_does_not():
    # It read "X fits with the most room: it needs ...; A, B fit(s) too", and without a size
    # "(a 26 GB GPU)", a GPU nobody sells.
    h = History()
    a = h.alloc(20 * GiB)
    h.free(a)
    h.alloc(10 * GiB)  # splits the cached 20 GiB segment under the defaults
    h.alloc(15 * GiB)  # past its free 10 GiB: a second segment (25 GiB expandable)
    r = w.whatif(h.snapshot(), [NATIVE, EXPANDABLE], fit=32)
    need = {row.label: row.min_bytes for row in r.fit.rows}
    assert need["expandable_segments:True"] < usable_bytes(32) < need["defaults"]
    assert r.fit.sentence() == ("On a 32 GB GPU (30.90 GiB for PyTorch) "
                                "expandable_segments:True fits and needs the least, 25.00 GiB; "
                                "defaults does not.")
    assert r.fit.sentence(40).endswith("25.00 GiB; defaults also fits.")
    assert r.fit.sentence(20).startswith("On a 20 GB GPU (18.90 GiB for PyTorch) no setting "
                                         "tried fits")
    untargeted = w.whatif(h.snapshot(), [EXPANDABLE], fit=True).fit.sentence()
    assert untargeted == ("The least memory: expandable_segments:True, 25.00 GiB for PyTorch "
                          "(a GPU of 27 GB or more).")


@pytest.mark.parametrize("gb", [1e-300, 0.25, 0.5, 1])
def test_a_gpu_smaller_than_its_cuda_context_is_refused_not_given_negative_room(loaded, gb):
    # It said "On a 0.25 GB GPU (-256.00 MiB for PyTorch) no setting tried fits"; with the
    # driver's reserve taken off too, a 1 GB GPU went negative the same way.
    with pytest.raises(w.SettingError, match="a GPU size in GB from 2 to"):
        w.whatif(History().snapshot(), [NATIVE], fit=gb)
    loaded.run_cell("%%gpumem --trace -q\nx = cuda.tensor(MiB)")
    with pytest.raises(UsageError, match="--fit takes a GPU size in GB from 2 to 1048576"):
        whatif(loaded, f"--fit {gb}")
    del loaded.user_ns["x"]


def test_fit_takes_this_processs_measured_context_not_a_fixed_512_mib(loaded, capsys):
    # H200 tutorials 08 and 09: a fixed 512 MiB was taken off every GPU size where the
    # process's context measured 610-742 MiB, so "a GPU of 6 GB or more" held 5.36 GiB.
    loaded.run_cell("%%gpumem --trace -q\nx = cuda.tensor(3 * GiB)")
    d = current_monitor(loaded).read().device(0)
    context = d.outside_pytorch_bytes
    reserve = d.nvml.driver_reserved_bytes
    assert context and context != CONTEXT_BYTES
    assert reserve and reserve != DRIVER_RESERVE_BYTES
    r = whatif(loaded, "--fit 24 -o")
    assert r.fit.context_bytes == context and r.fit.context_measured
    assert r.fit.reserve_bytes == reserve and r.fit.reserve_measured
    assert r.fit.sentence().startswith(
        f"On a 24 GB GPU ({format_bytes(24 * GiB - reserve - context)} for PyTorch)")
    assert "measured now" in r.fit.lines()[0]
    del loaded.user_ns["x"]


def test_a_snapshot_from_a_file_says_its_context_is_assumed(loaded, tmp_path):
    h = History()
    h.alloc(3 * GiB)
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(h.snapshot()))
    r = whatif(loaded, f"--trace {path} --fit 24 -o")
    assert r.fit.context_bytes == CONTEXT_BYTES and not r.fit.context_measured
    assert "assumed" in r.fit.lines()[0]
    # The driver's reserve is this GPU's whoever recorded the file: read, not assumed.
    assert r.fit.reserve_measured and "this GPU's, read from NVML" in r.fit.lines()[0]


def test_an_n_gb_gpu_leaves_out_what_the_driver_reserves_for_itself():
    # Tutorials review M8: N GiB less the context alone overstated the H200 itself by its
    # 615 MiB driver reserve, so a run that needed all but 300 MiB of it was said to fit.
    h = History()
    h.alloc(24 * GiB - CONTEXT_BYTES - 300 * MiB)
    (row,) = w.whatif(h.snapshot(), [NATIVE], fit=24).fit.rows
    assert row.fits(24, CONTEXT_BYTES, reserve_bytes=0)
    assert not row.fits(24)
    unread = w.whatif(h.snapshot(), [NATIVE], fit=24).fit
    assert not unread.reserve_measured and unread.reserve_bytes == DRIVER_RESERVE_BYTES
    assert "assumed: the H200's" in unread.lines()[0]
    assert "no setting tried fits" in unread.sentence()


def test_a_larger_context_moves_the_smallest_gpu_up():
    h = History()
    h.alloc(int(4.8 * GiB))
    rows = w.whatif(h.snapshot(), [NATIVE], fit=True).fit.rows
    measured = Fit(rows, context_bytes=742 * MiB, context_measured=True)
    assert "(a GPU of 6 GB or more)" in Fit(rows).sentence()
    assert "(a GPU of 7 GB or more)" in measured.sentence()


def test_a_context_too_large_for_the_gpu_says_nothing_is_left_not_a_negative_room():
    h = History()
    h.alloc(GiB)
    rows = w.whatif(h.snapshot(), [NATIVE], fit=True).fit.rows
    big = Fit(rows, 2.0, context_bytes=2 * GiB, context_measured=True)
    assert big.usable_bytes(2) < 0
    assert big.sentence() == ("On a 2 GB GPU the driver's reserve and the context leave "
                              "PyTorch nothing: the least is defaults at 1.00 GiB.")
