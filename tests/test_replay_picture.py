"""The replay's picture, the one an untrusted notebook (or any viewer without the widget's
JavaScript) shows, names what it plots: the recorded H200, with its total and headroom, as the
live chart's header does; never this machine's "host RAM" (issue 27)."""

from __future__ import annotations

import base64
import re
from typing import Any

from gpumem_nb.kernel import current_monitor


def picture_of(bundle: dict[str, str]) -> str:
    src = re.search(r'src="data:image/svg\+xml;base64,([^"]+)"', bundle["text/html"])
    assert src is not None, bundle["text/html"][:300]
    return base64.b64decode(src.group(1)).decode()


def test_the_replays_untrusted_picture_names_the_recorded_gpu_and_its_headroom(
        shell: Any, no_gpu: Any, capsys: Any) -> None:
    shell.run_cell("%load_ext gpumem_nb", store_history=True)
    shell.run_cell("%gpumem watch --replay bundled", store_history=True)
    mon = current_monitor(shell)
    mon.replay.sampler.stop()  # before the first tick: the state a fresh display is in
    bundle = mon.widget.plain_bundle()
    svg = picture_of(bundle)
    title = re.search(r"<title>([^<]*)</title>", svg)
    assert title is not None and title.group(1).startswith(
        "gpumem_nb chart: GPU 0 (NVIDIA H200)"), title
    assert re.search(r"total 1\d\d\.\d GiB · headroom 1\d\d\.\d GiB", svg), svg[:2000]
    assert bundle["image/svg+xml"] == svg
    mon.replay.sampler.tick()
    assert "NVIDIA H200" in mon.widget.header.value  # what the trusted view says


def play_until(mon: Any, into_s: float) -> None:
    """The replay's clock set to ``into_s`` seconds into the recording, then one tick."""
    src = mon.replay.source
    src.start()
    t0 = src._t0
    src._clock = lambda: t0 + into_s
    mon.replay.sampler.tick()


def test_stop_shows_where_the_replay_stood_not_the_recordings_end(shell: Any, no_gpu: Any,
                                                                   capsys: Any) -> None:
    """``--stop`` 20 s into the replay showed the recording's end (618.81 MiB, reserved 0 B)
    in the table, where the live table had read 6.60 GiB: the table is now the reading the
    replay stood at, says so, and the picture of the whole recording marks that point."""
    from gpumem_nb.units import format_bytes

    shell.run_cell("%load_ext gpumem_nb", store_history=True)
    shell.run_cell("%gpumem watch --replay bundled", store_history=True)
    mon = current_monitor(shell)
    mon.replay.sampler.stop()
    play_until(mon, 20.0)
    recording = mon.replay.source.recording
    t0 = recording[0].t_s
    stood = [s for s in recording if s.t_s - t0 <= 20.0][-1].devices[0].nvml
    end = recording[-1].devices[0].nvml
    assert stood.used_bytes != end.used_bytes  # the two readings tell apart
    bundle = mon.widget.plain_bundle()
    assert f"{format_bytes(stood.used_bytes)} / {format_bytes(stood.total_bytes)}" in \
        bundle["text/plain"], bundle["text/plain"]
    assert f"{format_bytes(end.used_bytes)} / " not in bundle["text/plain"]
    assert "where the replay stood, 2" in bundle["text/plain"]  # 19.x or 20.0 s into it
    assert ">replay here<" in picture_of(bundle)
    # The chart's end (``--stop``) leaves that same picture and table in its output.
    shell.run_cell("%gpumem watch --stop", store_history=True)
    assert mon.widget is None or mon.widget.picture.ended


def test_an_ended_replays_table_is_the_recordings_end_with_no_mark(shell: Any, no_gpu: Any,
                                                                    capsys: Any) -> None:
    from gpumem_nb.units import format_bytes

    shell.run_cell("%load_ext gpumem_nb", store_history=True)
    shell.run_cell("%gpumem watch --replay bundled", store_history=True)
    mon = current_monitor(shell)
    mon.replay.sampler.stop()
    play_until(mon, 1e6)
    end = mon.replay.source.recording[-1].devices[0].nvml
    bundle = mon.widget.plain_bundle()
    assert f"{format_bytes(end.used_bytes)} / {format_bytes(end.total_bytes)}" in \
        bundle["text/plain"]
    assert "the table is the recording's end" in bundle["text/plain"]
    assert "replay here" not in picture_of(bundle)


def test_a_replays_host_ram_line_is_the_recordings_not_this_kernels(shell: Any, no_gpu: Any,
                                                                     capsys: Any) -> None:
    """Every replay picture said "Host RAM of this process: 628.82 MiB", the recording's."""
    shell.run_cell("%load_ext gpumem_nb", store_history=True)
    shell.run_cell("%gpumem watch --replay bundled", store_history=True)
    mon = current_monitor(shell)
    mon.replay.sampler.stop()
    play_until(mon, 1e6)
    text = mon.widget.plain_bundle()["text/plain"]
    assert "Host RAM of this process" not in text
    assert "Host RAM of the recorded process: 628.82 MiB (the recording's)." in text


def test_gpu_names_of_a_megabyte_in_a_recording_leave_the_picture_bundle_small(
        shell: Any, no_gpu: Any, capsys: Any, tmp_path: Any) -> None:
    """Two GPUs named with 1 MiB each made a 23 MB picture bundle, sent again at each
    change: every view cuts a GPU's name as the cluster table does (issue 36, D2)."""
    from .helpers import replay_gpus_named

    mon = replay_gpus_named(shell, tmp_path / "huge_names.json",
                            ["A" * (1 << 20), "B" * (1 << 20)], note="N" * (1 << 20))
    bundle = mon.widget.picture_bundle()
    sizes = {mime: len(text) for mime, text in bundle.items()}
    assert sum(sizes.values()) < 100_000, sizes
    from gpumem_nb.units import MAX_NAME_CHARS

    cut_name = "A" * (MAX_NAME_CHARS - 1) + "…"
    assert cut_name in bundle["text/plain"] and cut_name in picture_of(bundle)
    assert len(mon.widget.header.value) < 20_000
    assert len(capsys.readouterr().out) < 20_000  # what the magic printed
