"""Recorded traces round-trip and play back in real time."""

from __future__ import annotations

import json
import os
from dataclasses import fields
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumem_nb.model import AllocatorReading, DeviceSample, NvmlReading, Sample
from gpumem_nb.sources import replay as replay_mod
from gpumem_nb.sources.replay import (
    ReplaySource,
    TraceError,
    load_trace,
    parse_trace,
    sample_to_json,
    write_trace,
)

from .fakes import GiB


def sample(t: float, used: int) -> Sample:
    nv = NvmlReading(0, "NVIDIA H200", "GPU-x", "0:18:00.0", 141 * GiB, used)
    al = AllocatorReading(used // 2, used, used // 2, 0, used, used, 0, 0)
    return Sample(t_s=t, wall_s=1e9 + t, rss_bytes=GiB, devices=(DeviceSample(0, nv, al),))


def test_trace_round_trips_every_field(tmp_path):
    samples = [sample(10.0, GiB), sample(10.5, 2 * GiB)]
    write_trace(tmp_path / "t.json", samples, note="demo")
    back, note = load_trace(tmp_path / "t.json")
    assert note == "demo"
    assert [s.devices for s in back] == [s.devices for s in samples]
    assert [s.t_s for s in back] == [0.0, 0.5]


def test_playback_follows_the_clock_and_loops_when_asked():
    now = [0.0]
    src = ReplaySource([sample(0.0, GiB), sample(1.0, 2 * GiB), sample(2.0, 3 * GiB)],
                       clock=lambda: now[0], loop=True)
    used = []
    for t in (0.0, 0.5, 1.2, 2.0, 2.5):
        now[0] = t
        s = src.read()
        assert s.t_s == t
        used.append(s.devices[0].nvml.used_bytes)  # type: ignore[union-attr]
    assert used == [GiB, GiB, 2 * GiB, 3 * GiB, GiB]


def test_playback_stops_at_the_end_of_the_recording_instead_of_looping_into_a_comb():
    """Issue 17: after 5 minutes the bundled replay had looped 11 times on an axis titled
    "seconds into the recording". It now holds its last reading, at the recording's end."""
    now = [10.0]
    src = ReplaySource([sample(0.0, GiB), sample(1.0, 2 * GiB), sample(2.0, 3 * GiB)],
                       clock=lambda: now[0])
    src.start()
    assert not src.ended
    seen = []
    for t in (10.0, 11.2, 12.5, 300.0):
        now[0] = t
        s = src.read()
        seen.append((s.t_s, s.devices[0].nvml.used_bytes))  # type: ignore[union-attr]
    assert seen == [(10.0, GiB), (11.2, 2 * GiB), (12.0, 3 * GiB), (12.0, 3 * GiB)]
    assert src.ended
    assert [x.t_s for x in src.recording] == [0.0, 1.0, 2.0]


def test_bundled_h200_session_loads():
    samples, note = load_trace(None)
    assert len(samples) > 10 and "H200" in note


def test_a_file_that_is_not_a_trace_is_refused_plainly(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{"samples": []}')
    with pytest.raises(ValueError, match="not a gpumem_nb trace"):
        load_trace(p)


# -- issue 8: replay files fully checked on load -----------------------------------------------
def good_body() -> dict[str, Any]:
    return json.loads(json.dumps({"format": "gpumem_nb-trace", "version": 1, "note": "n",
            "samples": [sample_to_json(sample(0.0, GiB)), sample_to_json(sample(0.5, 2 * GiB))]}))


def edit(path: list[Any], value: Any) -> dict[str, Any]:
    body = good_body()
    target: Any = body
    for key in path[:-1]:
        target = target[key]
    if value is DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return body


DELETE = object()
NV = ["samples", 1, "devices", 0, "nvml"]
AL = ["samples", 1, "devices", 0, "allocator"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (edit([*NV, "used_bytes"], "x"), 'sample 1, device 0, nvml: "used_bytes" is "x"'),
        (edit([*NV, "used_bytes"], -1), '"used_bytes" is -1, not a whole number of bytes'),
        (edit([*NV, "used_bytes"], 1.5), '"used_bytes" is 1.5'),
        (edit([*NV, "used_bytes"], True), '"used_bytes" is true'),
        (edit([*NV, "used_bytes"], 2**70), '"used_bytes" is 1180591620717411303424'),
        (edit([*NV, "name"], 7), '"name" is 7, not a string'),
        (edit([*NV, "status"], "fine"), '"status" is "fine", not one of ok, lost, error'),
        (edit([*NV, "uuid"], DELETE), 'lacks the field "uuid"'),
        (edit([*NV, "colour"], "red"), 'unknown field "colour"'),
        (edit([*AL, "num_ooms"], "many"), 'allocator: "num_ooms" is "many"'),
        (edit([*AL, "num_ooms"], None), '"num_ooms" is null'),
        (edit([*AL, "reserved_bytes"], DELETE), 'lacks the field "reserved_bytes"'),
        (edit(AL, []), "allocator is [], not an object"),
        (edit(["samples", 1, "devices", 0, "index"], "0"), '"index" is "0"'),
        (edit(["samples", 1, "devices", 0], 3), "sample 1, device 0 is 3, not an object"),
        (edit(["samples", 1, "devices"], {}), '"devices" is {}, not a list'),
        (edit(["samples", 1, "t_s"], DELETE), 'sample 1 lacks the field "t_s"'),
        (edit(["samples", 1, "t_s"], "soon"), '"t_s" is "soon", not a finite number'),
        (edit(["samples", 1, "t_s"], float("nan")), '"t_s" is NaN'),
        (edit(["samples", 1, "t_s"], -1.0), '"t_s" goes back in time'),
        (edit(["samples", 1, "wall_s"], "now"), '"wall_s" is "now"'),
        (edit(["samples", 1, "rss_bytes"], "1GB"), '"rss_bytes" is "1GB"'),
        (edit(["samples", 1], None), "sample 1 is null, not an object"),
        (edit(["samples"], {}), '"samples" is {}, not a list'),
        (edit(["samples"], DELETE), '"samples" is null, not a list'),
        (edit(["samples"], []), "holds no samples"),
        (edit(["note"], 5), '"note" is 5, not a string'),
        (edit(["version"], 2), "version 2"),
        (edit(["format"], DELETE), "not a gpumem_nb trace"),
        ([], "not a gpumem_nb trace"),
        ("[" * 50_000, "not valid JSON"),
        ('{"format": ', "not valid JSON"),
    ],
)
def test_a_malformed_trace_is_refused_with_a_message_naming_the_problem(tmp_path, body, message):
    p = tmp_path / "bad.json"
    p.write_text(body if isinstance(body, str) else json.dumps(body))
    with pytest.raises(TraceError) as e:
        ReplaySource.from_file(p)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert isinstance(e.value, ValueError)


def test_the_edits_above_start_from_a_trace_that_loads(tmp_path):
    p = tmp_path / "good.json"
    p.write_text(json.dumps(good_body()))
    samples, _ = load_trace(p)
    assert [s.devices for s in samples] == [sample(0.0, GiB).devices, sample(0.5, 2 * GiB).devices]


@pytest.mark.parametrize("special", ["fifo", "/dev/zero", "directory", "missing"])
def test_a_special_or_missing_replay_file_is_refused_at_once(tmp_path, special):
    from .test_safeio import finishes

    path, release = {"fifo": (tmp_path / "pipe", tmp_path / "pipe"),
                     "directory": (tmp_path, None), "missing": (tmp_path / "nope.json", None),
                     "/dev/zero": ("/dev/zero", None)}[special]
    if special == "fifo":
        os.mkfifo(path)
    with pytest.raises(TraceError, match=r"FIFO|device|directory|No such file"):
        finishes(lambda: ReplaySource.from_file(path), release)


def test_a_replay_over_the_size_cap_is_not_read(tmp_path, monkeypatch):
    monkeypatch.setattr(replay_mod, "MAX_TRACE_BYTES", 1000)
    p = tmp_path / "big.json"
    p.write_text(json.dumps(good_body()) + " " * 1000)
    with pytest.raises(TraceError, match="larger than 1000 bytes"):
        load_trace(p)


def test_a_bad_replay_file_in_watch_is_a_usage_error_and_changes_nothing(shell, no_gpu, tmp_path):
    from IPython.core.error import UsageError

    from gpumem_nb.kernel import current_monitor

    shell.run_cell("%load_ext gpumem_nb")
    shell.run_cell("x = 1")
    mon = current_monitor(shell)
    before = (mon.source, len(mon.history), mon.widget, mon.replay)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(edit([*NV, "used_bytes"], "x")))
    with pytest.raises(UsageError, match=r'cannot replay .*"used_bytes" is "x"'):
        shell.run_line_magic("gpumem", f"watch --replay {p}")
    assert (mon.source, len(mon.history), mon.widget, mon.replay) == before
    assert mon.sampler.running


@pytest.mark.parametrize("how", ["magic", "variable"])
def test_a_replay_file_under_a_tilde_is_read_from_the_home_directory(shell, no_gpu, tmp_path,
                                                                     monkeypatch, how):
    from gpumem_nb.kernel import current_monitor

    monkeypatch.setenv("HOME", str(tmp_path))
    write_trace(tmp_path / "session.json", [sample(0.0, GiB), sample(1.0, 2 * GiB)])
    if how == "variable":
        monkeypatch.setenv("GPUMEM_NB_REPLAY", "~/session.json")
    shell.run_cell("%load_ext gpumem_nb")
    if how == "magic":
        shell.run_line_magic("gpumem", "watch --replay ~/session.json")
    replay = current_monitor(shell).replay
    assert replay is not None and len(replay.source.recording) == 2


# -- GPUMEM_NB_REPLAY that cannot be replayed --------------------------------------------------
@pytest.mark.parametrize("value", ["/no/such/trace.json", "bundeld", "fifo", "bad"])
def test_a_replay_variable_typo_loads_live_with_one_line(shell, no_gpu, monkeypatch, tmp_path,
                                                          capsys, value):
    from gpumem_nb.kernel import current_monitor

    from .test_safeio import finishes

    release = None
    if value == "fifo":
        value = release = str(tmp_path / "pipe")
        os.mkfifo(value)
    elif value == "bad":
        value = str(tmp_path / "bad.json")
        with open(value, "w") as f:
            json.dump(edit([*AL, "num_ooms"], "many"), f)
    monkeypatch.setenv("GPUMEM_NB_REPLAY", value)
    result = finishes(lambda: shell.run_cell("%load_ext gpumem_nb"), release)
    assert result.success
    mon = current_monitor(shell)
    assert mon is not None and mon.replay is None and mon.sampler.running
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "GPUMEM_NB_REPLAY" in ln]
    assert len(lines) == 1 and "ignored" in lines[0] and value in lines[0]


def test_a_replay_variable_naming_a_good_trace_still_replays(shell, no_gpu, monkeypatch):
    from gpumem_nb.kernel import current_monitor

    monkeypatch.setenv("GPUMEM_NB_REPLAY", "bundled")
    shell.run_cell("%load_ext gpumem_nb")
    assert isinstance(current_monitor(shell).replay.source, ReplaySource)


# -- property: any edit to any field either loads as typed data or is a TraceError -------------
def leaf_paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(value, dict):
        return [path] + [p for k, v in value.items() for p in leaf_paths(v, (*path, k))]
    if isinstance(value, list):
        return [path] + [p for i, v in enumerate(value) for p in leaf_paths(v, (*path, i))]
    return [path]


PATHS = [p for p in leaf_paths(good_body()) if p]
junk = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                    lambda c: st.lists(c, max_size=2) | st.dictionaries(st.text(max_size=4), c,
                                                                        max_size=2),
                    max_leaves=4)


@settings(max_examples=200, deadline=None)
@given(edits=st.lists(st.tuples(st.sampled_from(PATHS), junk | st.just(DELETE)), min_size=1,
                      max_size=3))
def test_any_edit_to_a_trace_loads_typed_samples_or_is_a_trace_error(edits):
    body: Any = good_body()
    for path, value in edits:
        try:
            target = body
            for key in path[:-1]:
                target = target[key]
            if value is DELETE:
                del target[path[-1]]
            else:
                target[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue  # an earlier edit removed or replaced this place
    try:
        samples, note = parse_trace(json.dumps(body))
    except TraceError as e:
        assert str(e) and "\n" not in str(e)
        return
    assert isinstance(note, str) and samples
    for s in samples:
        assert isinstance(s.t_s, float) and isinstance(s.wall_s, float)
        assert s.rss_bytes is None or type(s.rss_bytes) is int
        for d in s.devices:
            assert type(d.index) is int
            for reading in (d.nvml, d.allocator):
                if reading is None:
                    continue
                for f in fields(reading):
                    v = getattr(reading, f.name)
                    if f.name == "children":  # this kernel's child processes, each typed
                        assert type(v) is tuple
                        for c in v:
                            assert all(getattr(c, g.name) is None or type(getattr(c, g.name))
                                       in (int, str) for g in fields(c)), c
                        continue
                    assert v is None or type(v) in (int, str), (f.name, v)
    src = ReplaySource(samples, clock=lambda: 1.0)  # what loaded also plays
    assert src.read().devices in [s.devices for s in samples]
    assert src.status().gpu_count == len(samples[0].devices)


def test_a_chart_of_the_replay_gets_every_recorded_point_at_its_own_time():
    """The tester's D4: sampled every 0.5 s, the 0.25 s spikes of the bundled recording were
    missed (hover read 8 GiB where it says 14), and the first reading was drawn at 0."""
    samples, _ = load_trace(None)
    now = [100.0]
    src = ReplaySource(samples, clock=lambda: now[0])
    src.start()
    now[0] = 100.0 + 12.0
    played = src.played()
    offsets = [s.t_s - samples[0].t_s for s in samples]
    want = [(o, s.devices[0].allocator) for o, s in zip(offsets, samples, strict=True)
            if o <= 12.0]
    assert [(p.t_s, p.devices[0].allocator) for p in played] == want
    now[0] = 100.0 + 13.0
    more = src.played(played[-1].t_s)  # only what played since
    assert [p.t_s for p in more] == [o for o in offsets if 12.0 < o <= 13.0]
    now[0] = 1000.0  # ended: the rest of the recording, then nothing
    rest = src.played(more[-1].t_s)
    assert rest[-1].t_s == pytest.approx(offsets[-1]) and not src.played(rest[-1].t_s)


def test_a_looping_replay_plays_each_pass_later_by_a_whole_recording():
    now = [0.0]
    src = ReplaySource([sample(0.0, GiB), sample(1.0, 2 * GiB), sample(2.0, 3 * GiB)],
                       clock=lambda: now[0], loop=True)
    src.start()
    now[0] = 4.5
    first = src.played()  # the current pass only: the third, from 4 s
    assert [round(p.t_s, 6) for p in first] == [4.0]
    now[0] = 6.5
    later = src.played(first[-1].t_s)  # the rest of the third pass, the fourth's start
    assert [(round(p.t_s, 6), p.devices[0].nvml.used_bytes) for p in later] == [  # type: ignore[union-attr]
        (5.0, 2 * GiB), (6.0, 3 * GiB), (6.0, GiB)]


# -- a long recording is checked as it plays (issue 36, D3) -----------------------------------
def long_trace(path: Any, n: int, *, gpus: int = 4, bad_at: int | None = None) -> None:
    """``n`` samples of ``gpus`` GPUs each; sample ``bad_at``'s first GPU reads "x" bytes."""
    one = sample(0.0, GiB).devices[0]
    write_trace(path, [Sample(t_s=i * 0.1, wall_s=1e9 + i, rss_bytes=GiB, devices=tuple(
        DeviceSample(j, one.nvml, one.allocator) for j in range(gpus))) for i in range(n)])
    if bad_at is not None:
        body = json.loads(path.read_text())
        body["samples"][bad_at]["devices"][0]["nvml"]["used_bytes"] = "x"
        path.write_text(json.dumps(body))


def test_a_long_replay_starts_once_its_first_samples_are_checked_and_checks_the_rest_as_it_plays(
        shell, no_gpu, tmp_path):
    # Checking every field of a 46 MB trace first held the kernel 5-18 s.
    from gpumem_nb.kernel import current_monitor

    path = tmp_path / "long.json"
    long_trace(path, 3000)
    shell.run_cell("%load_ext gpumem_nb")
    shell.run_line_magic("gpumem", f"watch --replay {path}")
    source = current_monitor(shell).replay.source
    current_monitor(shell).replay.sampler.stop()
    assert 0 < len(source.recording) < 3000
    assert any("checked as they play" in n for n in source.status().notes)
    for _ in range(3):  # each reading the sampler plays checks the samples ahead of it
        source.read()
    assert len(source.recording) == 3000
    assert not any("checked" in n for n in source.status().notes)


def test_a_malformed_sample_late_in_a_long_replay_ends_it_there_in_a_sentence(
        shell, no_gpu, tmp_path):
    from gpumem_nb.kernel import current_monitor

    path = tmp_path / "late.json"
    long_trace(path, 3000, bad_at=2500)
    shell.run_cell("%load_ext gpumem_nb")
    shell.run_line_magic("gpumem", f"watch --replay {path}")  # no UsageError: it plays
    replay = current_monitor(shell).replay
    replay.sampler.stop()
    for _ in range(3):
        replay.source.read()
    assert len(replay.source.recording) == 2500
    assert replay.source.status().notes[-1] == (
        'The recording stops before sample 2,500 of 3,000, which cannot be played (sample '
        '2500, device 0, nvml: "used_bytes" is "x", not a whole number of bytes (0 or more) '
        'or null).')
    replay.sampler.tick()  # the chart keeps playing what there is
    assert replay.sampler.latest() is not None


def test_a_recording_checked_as_it_plays_plays_to_its_last_sample(tmp_path):
    path = tmp_path / "long.json"
    long_trace(path, 6000)
    rec, _ = replay_mod.open_trace(path)
    now = [0.0]
    src = ReplaySource(rec, clock=lambda: now[0])
    src.read()
    assert len(src.recording) < 6000  # checked ahead of the playback, not to its end
    now[0] = 1000.0  # long after the last sample, at 599.9 s
    assert round(src.read().wall_s) > 0 and src.ended
    assert len(src.recording) == 6000
    assert [round(s.t_s, 6) for s in src.played(599.85)] == [599.9]


def test_a_recording_that_starts_idle_says_so_instead_of_flat_lines_with_no_word():
    # The bundled H200 session is idle for its first 5.5 s (CUDA starts then): a newcomer
    # watching it during Run All saw flat lines at 0 and nothing said.
    idle = ReplaySource([sample(0.0, 0), sample(3.0, 0), sample(5.5, GiB), sample(6.0, 2 * GiB)])
    assert any("idle for its first 5.5 s" in n for n in idle.status().notes)
    busy = ReplaySource([sample(0.0, GiB), sample(3.0, 2 * GiB)])
    assert not any("idle" in n for n in busy.status().notes)
    brief = ReplaySource([sample(0.0, 0), sample(0.5, GiB)])
    assert not any("idle" in n for n in brief.status().notes)


def test_the_bundled_session_says_its_idle_start():
    notes = ReplaySource.from_file(None).status().notes
    assert any(n.startswith("The recording is idle for its first 5.5 s") for n in notes), notes
