"""Files the user names are read without hanging or filling memory, and written atomically
without following links: the promises of gpumem_nb.safeio, each against the file that broke
them."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable
from typing import Any

import pytest

from gpumem_nb import safeio


def finishes(fn: Callable[[], Any], path: Any = None, timeout_s: float = 5.0) -> Any:
    """``fn()``'s result or exception, asserting it returns in time. A reader stuck on a FIFO
    is released by opening the FIFO for writing, so a failing test never hangs the suite."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:
            box["error"] = e

    th = threading.Thread(target=target, daemon=True)
    th.start()
    th.join(timeout_s)
    hung = th.is_alive()
    if hung and path is not None:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        th.join(timeout_s)
    assert not hung, "blocked"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def test_reading_a_fifo_returns_at_once_with_a_refusal(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(safeio.RefusedPath, match="FIFO"):
        finishes(lambda: safeio.read_text(fifo, max_bytes=100), fifo)


def test_reading_dev_zero_is_refused_without_reading_it():
    with pytest.raises(safeio.RefusedPath, match="is a device, not a regular file"):
        finishes(lambda: safeio.read_text("/dev/zero", max_bytes=100))


def test_reading_a_directory_is_refused(tmp_path):
    with pytest.raises(safeio.RefusedPath, match="is a directory"):
        safeio.read_text(tmp_path, max_bytes=100)


def test_a_file_over_the_cap_is_refused(tmp_path):
    p = tmp_path / "big"
    p.write_bytes(b"x" * 101)
    with pytest.raises(safeio.RefusedPath, match="larger than 100 bytes"):
        safeio.read_text(p, max_bytes=100)
    assert safeio.read_text(p, max_bytes=101) == "x" * 101


def test_a_file_whose_size_lies_is_still_capped():
    # /proc files report st_size 0 yet hold more: the cap counts bytes read, not st_size.
    assert os.stat("/proc/self/maps").st_size == 0
    with pytest.raises(safeio.RefusedPath, match="larger than 10 bytes"):
        safeio.read_text("/proc/self/maps", max_bytes=10)


def test_a_symlink_is_refused_when_links_are_not_followed(tmp_path):
    target = tmp_path / "real.json"
    target.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    with pytest.raises(safeio.RefusedPath, match="symbolic link"):
        safeio.read_text(link, max_bytes=100, follow_symlinks=False)
    assert safeio.read_text(link, max_bytes=100) == "{}"


def test_a_symlink_to_a_fifo_is_refused_even_when_links_are_followed(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "link"
    link.symlink_to(fifo)
    with pytest.raises(safeio.RefusedPath, match="FIFO"):
        finishes(lambda: safeio.read_text(link, max_bytes=100), fifo)


@pytest.mark.parametrize("name", ["a\0b", "", "\ud800"])
def test_a_nul_empty_or_unencodable_path_is_an_oserror_with_a_plain_reason(name):
    with pytest.raises(safeio.RefusedPath) as e:
        safeio.read_text(name, max_bytes=10)
    assert isinstance(e.value, OSError) and safeio.reason(e.value).startswith((
        "contains a NUL character", "is an empty file name", "is not a valid file name"))
    with pytest.raises(safeio.RefusedPath):
        safeio.write_text_atomic(name, "x")


def test_a_file_that_is_not_utf8_is_refused(tmp_path):
    p = tmp_path / "bin"
    p.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(safeio.RefusedPath, match="not UTF-8"):
        safeio.read_text(p, max_bytes=100)


# -- writing ---------------------------------------------------------------------------------
def test_writing_never_follows_a_symlink_and_leaves_its_target_alone(tmp_path):
    victim = tmp_path / "bashrc"
    victim.write_text("precious")
    link = tmp_path / "config.json"
    link.symlink_to(victim)
    with pytest.raises(safeio.RefusedPath, match="symbolic link"):
        safeio.write_text_atomic(link, "{}")
    assert victim.read_text() == "precious" and link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bashrc", "config.json"]


def test_writing_onto_a_fifo_or_a_directory_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(safeio.RefusedPath, match="FIFO"):
        finishes(lambda: safeio.write_text_atomic(fifo, "x"), fifo)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    with pytest.raises(safeio.RefusedPath, match="directory"):
        safeio.write_text_atomic(tmp_path, "x")


def test_writing_onto_a_device_is_refused():
    with pytest.raises(safeio.RefusedPath, match="device"):
        safeio.write_text_atomic("/dev/null", "x")


def test_a_write_that_fails_midway_leaves_the_old_file_whole_and_no_temp_file(tmp_path,
                                                                              monkeypatch):
    p = tmp_path / "config.json"
    p.write_text("old")
    real_write = os.write

    def disk_full(fd: int, data: Any) -> int:
        real_write(fd, bytes(data[:2]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", disk_full)
    with pytest.raises(OSError, match="No space left"):
        safeio.write_text_atomic(p, "new contents")
    monkeypatch.undo()
    assert p.read_text() == "old"
    assert [x.name for x in tmp_path.iterdir()] == ["config.json"]


def test_a_write_replaces_the_file_and_keeps_its_permission_bits(tmp_path):
    p = tmp_path / "h.csv"
    p.write_text("old")
    p.chmod(0o600)
    assert safeio.write_text_atomic(p, "new\n") == p
    assert p.read_text() == "new\n" and stat.S_IMODE(p.stat().st_mode) == 0o600


def test_a_new_file_gets_the_mode_open_would_give_it(tmp_path):
    old = os.umask(0o027)
    try:
        safeio.write_text_atomic(tmp_path / "n.csv", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "n.csv").stat().st_mode) == 0o640


def test_a_write_into_a_missing_directory_is_an_oserror(tmp_path):
    with pytest.raises(FileNotFoundError):
        safeio.write_text_atomic(tmp_path / "nope" / "h.csv", "x")


def test_a_name_that_is_not_utf8_is_shown_printably():
    assert safeio.shown("a\udcffb") == "a\\udcffb"
    print(safeio.shown("a\udcffb"))
