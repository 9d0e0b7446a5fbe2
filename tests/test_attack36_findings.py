"""What the attack36 round (benchmarks/attack36/) found still broken on the surfaces issue 36
fixed. Each test states the promise and fails today (strict xfail): a fix makes it pass."""

from __future__ import annotations

import copy
import json
import time
import tracemalloc
import zlib
from pathlib import Path
from typing import Any, ClassVar

import pytest
from IPython.core.error import UsageError

from gpumem_nb.kernel import current_monitor

from .fakes import MiB
from .helpers import hang_guard, whatif
from .whatif_history import History

BUNDLED = Path(__file__).resolve().parent.parent / "gpumem_nb" / "data" / "h200_session.json"


def _trace(tmp_path: Path, name: str, mutate: Any, samples: int = 20) -> Path:
    body = json.loads(BUNDLED.read_text())
    body["samples"] = body["samples"][:samples]
    mutate(body)
    p = tmp_path / name
    p.write_text(json.dumps(body))
    return p


def _replay(shell: Any, path: Path) -> Any:
    shell.run_cell("%load_ext gpumem_nb", store_history=True)
    shell.run_line_magic("gpumem", f"watch --replay {path}")
    mon = current_monitor(shell)
    mon.replay.sampler.stop()
    mon.replay.sampler.tick()
    return mon


# -- F2 -------------------------------------------------------------------------------------------
def test_a_gzipd_pickle_of_dup_opcodes_peaks_at_a_small_multiple_of_the_unpack_bound(
        loaded, tmp_path, monkeypatch):
    from gpumem_nb.whatif import unpack
    bound = 16 * MiB
    monkeypatch.setattr(unpack, "MAX_UNPACKED_BYTES", bound)
    path = tmp_path / "dup.pickle.gz"
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    with open(path, "wb") as f:
        f.write(packer.compress(b"\x80\x02]q\x00(N"))
        for _ in range(15):
            f.write(packer.compress(b"2" * MiB))
        f.write(packer.compress(b"e.") + packer.flush())
    # What a kernel that has run many cells (or this suite, after a few dozen files) holds:
    # memory freed but still resident in the C heap, which the unpickler's growing stack can
    # reuse without the RSS moving. Freeing a large block raises glibc's mmap threshold (to
    # at most 32 MiB), as any earlier large buffer does, so blocks below it come from the heap.
    large = bytearray(30 * MiB)
    del large
    freed = [bytes(200_000) for _ in range(1500)]
    del freed
    tracemalloc.start()
    try:
        with pytest.raises(UsageError):
            whatif(loaded, f"--trace {path}")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * bound, f"{peak >> 20} MiB for a {bound >> 20} MiB bound"


def test_a_recorded_setting_holding_escapes_and_a_lone_surrogate_is_shown_printable(
        loaded, tmp_path):
    h = History()
    a = h.alloc(16 * MiB)
    h.alloc(8 * MiB)
    h.free(a)
    snap = h.snapshot()
    snap["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"] = "\ud800\x1b[31m"
    path = tmp_path / "s.json"
    path.write_text(json.dumps(snap))
    shown: list[dict[str, Any]] = []
    pub = loaded.display_pub
    real = pub.publish
    pub.publish = lambda data, metadata=None, **kw: shown.append(dict(data))
    try:
        whatif(loaded, f"--trace {path}")
    finally:
        pub.publish = real
    text = " ".join(str(b.get("text/plain", "")) + str(b.get("text/html", "")) for b in shown)
    assert "Recorded under" in text
    assert "\x1b" not in text
    text.encode("utf-8")  # what a kernel does before sending it


# -- D1 / D2 --------------------------------------------------------------------------------------
def _children(cmdline: str, n: int) -> Any:
    def mutate(body: dict[str, Any]) -> None:
        for s in body["samples"]:
            for d in s["devices"]:
                d["nvml"]["children"] = [{"pid": i + 7, "nbytes": MiB, "cmdline": cmdline,
                                          "role": "other"} for i in range(n)]
    return mutate


def test_a_replayed_childs_command_line_is_shown_printable(shell, no_gpu, tmp_path):
    path = _trace(tmp_path, "child.json", _children("C\ud800\x1b[2J", 1))
    mon = _replay(shell, path)
    bundle = mon.widget.plain_bundle()
    for mime in ("text/plain", "text/html"):
        assert "\x1b" not in bundle[mime]
        bundle[mime].encode("utf-8")


def test_a_replay_with_many_children_keeps_the_picture_bundle_small(shell, no_gpu, tmp_path):
    path = _trace(tmp_path, "children.json", _children("c" * 200, 20_000), samples=3)
    mon = _replay(shell, path)
    bundle = mon.widget.plain_bundle()
    size = sum(len(v) for v in bundle.values())
    assert size < 400_000, size
    assert "19,936 more in the longest listing (20,000) were left out" in bundle["text/plain"]


def test_a_traced_cell_with_a_form_feed_names_each_line_as_written(loaded):
    loaded.run_cell("%%gpumem --trace -q\n"
                    "a1 = cuda.tensor(64 * MiB); s = '\x0c'\n"
                    "b2 = cuda.tensor(32 * MiB)\n"
                    "c3 = cuda.tensor(16 * MiB)\n", store_history=True)
    traced = current_monitor(loaded).last_trace
    labels = " | ".join(s.label for d in traced.devices for s in d.series)
    assert "b2 = cuda.tensor(32" in labels and "c3 = cuda.tensor(16" in labels, labels


# -- D3 -------------------------------------------------------------------------------------------
def test_a_replay_whose_time_is_a_4000_digit_integer_is_refused_in_a_sentence(
        shell, no_gpu, tmp_path):
    path = _trace(tmp_path, "huge.json", lambda b: b["samples"][0].update(t_s="HUGE"))
    path.write_text(path.read_text().replace('"HUGE"', "9" * 4000))
    shell.run_cell("%load_ext gpumem_nb", store_history=True)
    with pytest.raises(UsageError):
        shell.run_line_magic("gpumem", f"watch --replay {path}")


def test_a_replayed_rss_of_five_million_floats_is_refused_without_serialising_it(
        shell, no_gpu, tmp_path):
    # The refusal quoted the value as JSON cut to 40 characters, after writing all of it:
    # 5.4 s for this list, on top of reading the file.
    path = _trace(tmp_path, "rss.json", lambda b: b["samples"][0].update(rss_bytes="RSS"))
    path.write_text(path.read_text().replace('"RSS"', "[" + ",".join(["0.5"] * 5_000_000) + "]"))
    shell.run_cell("%load_ext gpumem_nb", store_history=True)
    body = json.loads(path.read_text())  # what reading the file costs, apart from the check
    t0 = time.thread_time()  # this thread's CPU: other processes' load does not count
    from gpumem_nb.sources.tracecheck import sample_from_json
    with pytest.raises(ValueError, match=r'"rss_bytes" is \[0\.5, 0\.5, 0\.5'):
        sample_from_json(body["samples"][0])
    assert time.thread_time() - t0 < 0.1
    del body
    with pytest.raises(UsageError, match=r'"rss_bytes" is \[0\.5, 0\.5'):
        shell.run_line_magic("gpumem", f"watch --replay {path}")


def test_a_replayed_sample_of_many_gpus_is_charted_in_linear_time(shell, no_gpu, tmp_path):
    def wide(body: dict[str, Any]) -> None:
        d0 = body["samples"][0]["devices"][0]
        devs = []
        for i in range(8000):
            d = copy.deepcopy(d0)
            d["index"] = d["nvml"]["nvml_index"] = i
            devs.append(d)
        body["samples"] = [dict(body["samples"][0], devices=devs)]
    path = _trace(tmp_path, "wide.json", wide)
    t0 = time.perf_counter()
    mon = _replay(shell, path)  # loaded, played (one tick) and charted
    bundle = mon.widget.plain_bundle()
    assert time.perf_counter() - t0 < 2.0
    assert "7,936 more in the widest (8,000) were left out" in bundle["text/plain"]


def test_a_sample_of_many_gpus_is_appended_to_the_chart_in_linear_time():
    # Each GPU's values filtered every device of the sample: 16,000 GPUs made 256 M checks.
    from gpumem_nb.chart.series import ChartSeries
    from gpumem_nb.model import AllocatorReading, DeviceSample, Sample
    from gpumem_nb.timeline import ALL_DEVICES, GIB

    reading = AllocatorReading(allocated_bytes=MiB, reserved_bytes=2 * MiB, active_bytes=MiB,
                               inactive_split_bytes=0, peak_allocated_bytes=MiB,
                               peak_reserved_bytes=2 * MiB, num_alloc_retries=0, num_ooms=0)
    devices = tuple(DeviceSample(i, None, reading) for i in range(16_000))
    series = ChartSeries(has_gpu=True)
    t0 = time.thread_time()  # this thread's CPU: other processes' load does not count
    series.append(Sample(t_s=1.0, wall_s=0.0, rss_bytes=None, devices=devices))
    # A hang guard: quadratic took minutes; linear took 0.53 s of CPU once under -n 2.
    assert time.thread_time() - t0 < hang_guard(0.5)
    assert len(series.timelines) == 16_001
    last = series.timelines[ALL_DEVICES].arrays("reserved", 0.0, 10).lists()[1]
    assert last == [16_000 * 2 * MiB / GIB]


# -- A4 -------------------------------------------------------------------------------------------
def test_an_int_subclass_key_in_out_runs_none_of_its_code(loaded):
    ran: ClassVar[list[str]] = []

    class HInt(int):
        def __format__(self, spec: str) -> str:
            ran.append("__format__")
            return int.__format__(self, spec)

        def __repr__(self) -> str:
            ran.append("__repr__")
            return int.__repr__(self)

        def __str__(self) -> str:
            ran.append("__str__")
            return int.__str__(self)

    loaded.user_ns["Out"][HInt(99999)] = loaded.user_ns["cuda"].tensor(64 * MiB)
    loaded.run_line_magic("gpumem", "who -o")
    assert ran == []


# -- OOM forms ------------------------------------------------------------------------------------
class _CountingStr(str):
    ran: ClassVar[list[str]] = []

    def split(self, *a: Any, **k: Any) -> list[str]:  # type: ignore[override]
        _CountingStr.ran.append("split")
        return str.split(self, *a, **k)

    def __hash__(self) -> int:
        _CountingStr.ran.append("__hash__")
        return str.__hash__(self)

    def __eq__(self, o: object) -> bool:
        _CountingStr.ran.append("__eq__")
        return str.__eq__(self, o)

    def __str__(self) -> str:
        _CountingStr.ran.append("__str__")
        return self


def test_an_exception_class_whose_module_and_name_are_str_subclasses_runs_no_code():
    from gpumem_nb.oom.forms import find_oom

    a = type("AcceleratorError", (RuntimeError,), {})
    a.__module__ = _CountingStr("torch")  # type: ignore[assignment]
    b = type("X", (RuntimeError,), {})
    b.__name__ = _CountingStr("OutOfMemoryError")
    b.__module__ = "cupy.cuda.memory"
    _CountingStr.ran.clear()
    assert find_oom(a("CUDA error: out of memory")) is not None
    assert find_oom(b("Out of memory allocating 1,024 bytes (allocated so far: 0 bytes).")) \
        is not None
    assert _CountingStr.ran == []


# -- G1 -------------------------------------------------------------------------------------------
def test_a_ctrl_c_in_cleanups_final_display_still_reports_what_was_done(loaded, monkeypatch):
    from gpumem_nb.ipython.commands import holders

    loaded.run_cell("a1 = cuda.tensor(8 * MiB); a2 = cuda.tensor(4 * MiB)", store_history=True)
    shown: list[Any] = []
    pub = loaded.display_pub
    monkeypatch.setattr(pub, "publish", lambda data, metadata=None, **kw: shown.append(data))

    def interrupted_display(*a: Any, **k: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(holders, "display", interrupted_display)
    result = loaded.run_cell("%gpumem cleanup --vars a1,a2", store_history=True)
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    assert "a1" not in loaded.user_ns
    assert any("gpumem cleanup" in str(d.get("text/plain", "")) for d in shown)


# -- C --------------------------------------------------------------------------------------------
def test_an_unknown_flag_holding_a_line_separator_is_echoed_escaped(loaded):
    with pytest.raises(UsageError) as e:
        loaded.run_line_magic("gpumem", "who --g\u2028c")
    assert "\u2028" not in str(e.value)


def test_a_100000_character_flag_is_refused_quickly_by_the_magic_itself(loaded):
    magic = loaded.magics_manager.registry["GpumemMagics"].gpumem
    # This thread's CPU time: shlex took 0.2 s of it unloaded (2.8 s loaded), a refusal
    # before splitting takes microseconds, and other processes' load does not count.
    t0 = time.thread_time()
    with pytest.raises(UsageError) as e:
        magic("who --" + "g" * 100_000)  # the magic's function: past IPython's expansion
    assert time.thread_time() - t0 < 0.05
    assert "more than any command takes" in str(e.value)
