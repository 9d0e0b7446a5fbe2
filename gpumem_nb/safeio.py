"""Reading and writing the few files the user names: settings, replay traces, CSV exports.

Two promises, kept for every such file:

- **Reads never hang and never exhaust memory.** Only regular files are read: a FIFO would
  block ``open`` until a writer appears, ``/dev/zero`` never ends, a directory is not text. The
  file is opened with ``O_NONBLOCK`` (so opening a FIFO returns at once) and checked with
  ``fstat`` on the open descriptor (so a path swapped between check and open cannot slip
  through), and at most ``max_bytes`` are read.
- **Writes are atomic and never follow a link.** Text goes to a temporary file in the same
  directory, is flushed to disk, then ``os.replace``-d over the destination: a crash or a full
  disk leaves the old file whole, never half a file. A destination that is a symbolic link or
  anything but a regular file is *refused* with a plain reason rather than replaced: replacing
  a link would silently break a dotfile manager's setup, following it would overwrite whatever
  it points at. ``os.replace`` itself never follows a link, so a link planted between the
  check and the rename is replaced, and its target is still untouched.
- **A write-protected file is not replaced.** ``os.replace`` needs write permission on the
  directory only, so a file you may not write (or one with no write bit at all, as ``chmod
  444`` leaves it, even for root) would be replaced all the same: it is refused instead. A
  directory you may not write into is refused up front, by ``check_writable``, before the
  work whose result it would hold (a traced cell) is done.
- **Any legal name can be written.** The temporary file has a short name of its own
  (``.gpumem_nb-XXXXXXXX.tmp``), not the destination's name plus a suffix, which made names of
  242-255 bytes impossible to save. Temporary files of ours that a killed process left
  behind (``kill -9`` mid-save) and that are older than ``STALE_TEMP_S`` are removed by the
  next write into that directory.

Every failure is an ``OSError``; ``reason(e)`` gives its plain words for a message.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import re
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

__all__ = [
    "STALE_TEMP_S",
    "Lock",
    "PathLike",
    "RefusedPath",
    "Writer",
    "check_writable",
    "locked",
    "read_bytes",
    "read_text",
    "reason",
    "remove_stale_temps",
    "shown",
    "write_atomic",
    "write_text_atomic",
]

PathLike = str | os.PathLike[str]

_TEMP_PREFIX = ".gpumem_nb-"
_TEMP_SUFFIX = ".tmp"
# mkstemp's names: its prefix, 8 characters of [a-z0-9_], its suffix. The second form is how
# earlier versions named them (".NAME.XXXXXXXX.tmp"), matched for the destination's NAME only.
_TEMP_NAME = re.compile(r"\.gpumem_nb-[a-z0-9_]{8}\.tmp")
# A temporary file untouched this long is a killed writer's: a save writes it in well under
# a second (a trace's pickle of 100k entries in a few). Were a live writer stopped longer
# (SIGSTOP), its rename would fail and be reported; the old file stays whole.
STALE_TEMP_S = 600.0
# Directory entries looked at for stale temporary files, per write (a huge directory costs
# at most this many).
_SCAN_CAP = 100_000

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class Writer(Protocol):
    def write(self, data: bytes | bytearray | memoryview, /) -> int: ...


class RefusedPath(OSError):
    """A path gpumem_nb will not read or write, with the reason in plain words."""

    def __init__(self, path: PathLike | str, why: str) -> None:
        super().__init__(errno.EINVAL, why, os.fspath(path) if _is_path(path) else str(path))

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def _is_path(path: object) -> bool:
    return isinstance(path, str | os.PathLike)


def shown(path: PathLike | str) -> str:
    """A path as text that can always be printed: a name holding bytes that are not UTF-8
    (surrogate escapes) would make ``print`` itself raise."""
    return os.fspath(path).encode("utf-8", "backslashreplace").decode("utf-8")


def reason(e: OSError) -> str:
    """The plain part of an OSError: ``No such file or directory``, ``is a symbolic link``."""
    return e.strerror or str(e)


def _checked(path: PathLike) -> str:
    if not _is_path(path):
        raise RefusedPath(repr(path), "is not a file name")
    text = os.fspath(path)
    if not isinstance(text, str):
        raise RefusedPath(repr(text), "is not a file name")
    if "\0" in text:
        # os.open would raise ValueError("embedded null byte"), which callers do not expect.
        raise RefusedPath(text.replace("\0", "\\0"), "contains a NUL character")
    if not text:
        raise RefusedPath("''", "is an empty file name")
    try:
        os.fsencode(text)
    except UnicodeEncodeError:  # a lone surrogate: no file system can hold that name
        raise RefusedPath(repr(text), "is not a valid file name (it holds a lone surrogate "
                                      "character)") from None
    return text


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def read_text(path: PathLike, *, max_bytes: int, follow_symlinks: bool = True) -> str:
    """The UTF-8 text of a regular file of at most ``max_bytes``; ``OSError`` otherwise.

    ``follow_symlinks=False`` refuses a path whose last component is a symbolic link.
    """
    data = read_bytes(path, max_bytes=max_bytes, follow_symlinks=follow_symlinks)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise RefusedPath(os.fspath(path), "is not UTF-8 text") from None


def read_bytes(path: PathLike, *, max_bytes: int, follow_symlinks: bool = True) -> bytes:
    """The contents of a regular file of at most ``max_bytes``; ``OSError`` otherwise."""
    text_path = _checked(path)
    flags = os.O_RDONLY | _O_NONBLOCK | _O_CLOEXEC | (0 if follow_symlinks else _O_NOFOLLOW)
    try:
        fd = os.open(text_path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow_symlinks and os.path.islink(text_path):
            raise RefusedPath(text_path, "is a symbolic link; gpumem_nb does not follow links "
                                         "for this file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RefusedPath(text_path, f"is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > max_bytes:
            raise RefusedPath(text_path, f"is larger than {max_bytes} bytes")
        # st_size can lie (a file still growing, /proc): read at most one byte past the cap.
        chunks: list[bytes] = []
        left = max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise RefusedPath(text_path, f"is larger than {max_bytes} bytes")
    return data


def _umask() -> int:
    # Linux shows the umask in /proc; elsewhere it can only be read by setting it, and the two
    # calls are back to back.
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def check_writable(path: PathLike) -> str:
    """``path`` as text if ``write_atomic`` may write there: not a link, not a FIFO, device
    or directory, not write-protected, in a directory that exists and that this process may
    write into; ``OSError`` otherwise (a name too long for the file system too). Lets a
    caller refuse a destination before doing the work whose result it would hold."""
    text_path = _checked(path)
    try:
        st = os.lstat(text_path)
    except FileNotFoundError:
        pass
    else:
        _refuse_kind(text_path, st.st_mode)
        _refuse_protected(text_path, st.st_mode)
    directory = os.path.dirname(os.path.abspath(text_path))
    if not os.path.isdir(directory):
        raise RefusedPath(text_path, "is in a directory that does not exist")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise RefusedPath(text_path, "is in a directory this process may not write into")
    return text_path


def _refuse_protected(text_path: str, mode: int) -> None:
    """A file this process may not write, or one nobody may (``chmod 444``: root may, but
    the bits say the file is not to be changed), is not replaced."""
    if not mode & 0o222 or not os.access(text_path, os.W_OK):
        raise RefusedPath(text_path, "is write-protected; gpumem_nb does not replace a file "
                                     "that may not be written")


def _refuse_kind(text_path: str, mode: int) -> None:
    if stat.S_ISLNK(mode):
        raise RefusedPath(text_path, "is a symbolic link; gpumem_nb writes only regular "
                                     "files and does not follow links")
    if not stat.S_ISREG(mode):
        raise RefusedPath(text_path, f"is {_kind(mode)}, not a regular file")


class _FdWriter:
    """The one method ``pickle.dump`` and ``write_atomic``'s callers need, straight to the
    descriptor (every byte written, or ``OSError``)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]
        return len(data)


def write_atomic(path: PathLike, fill: Callable[[Writer], object]) -> Path:
    """Replace ``path`` in one step with what ``fill`` writes to the file it is handed;
    refuse links and non-regular files. Whatever ``fill`` raises leaves the old file whole
    and no temporary file behind.

    The directory must exist. An existing file keeps its permission bits.
    """
    text_path = _checked(path)
    try:
        st = os.lstat(text_path)
    except FileNotFoundError:
        mode = 0o666 & ~_umask()  # what open() would give a new file
    else:
        _refuse_kind(text_path, st.st_mode)
        _refuse_protected(text_path, st.st_mode)
        mode = stat.S_IMODE(st.st_mode)
    directory, name = os.path.split(os.path.abspath(text_path))
    remove_stale_temps(directory, name)
    fd, tmp = tempfile.mkstemp(prefix=_TEMP_PREFIX, suffix=_TEMP_SUFFIX, dir=directory)
    try:
        try:
            fill(_FdWriter(fd))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, mode)
        os.replace(tmp, text_path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return Path(text_path)


def remove_stale_temps(directory: str, name: str, *, now_s: float | None = None) -> int:
    """Remove the temporary files of ours in ``directory`` that a killed writer left: regular
    files owned by this user, named as ``write_atomic`` names them (or, for ``name``, as
    earlier versions did), last written more than ``STALE_TEMP_S`` ago. Never raises; how
    many it removed."""
    now = time.time() if now_s is None else now_s
    legacy = re.compile(re.escape(f".{name}.") + r"[a-z0-9_]{8}\.tmp")
    uid = os.getuid() if hasattr(os, "getuid") else -1
    removed = 0
    try:
        with os.scandir(directory) as entries:
            for entry in itertools.islice(entries, _SCAN_CAP):
                n = entry.name
                if not (_TEMP_NAME.fullmatch(n) or legacy.fullmatch(n)):
                    continue
                with contextlib.suppress(OSError):
                    st = entry.stat(follow_symlinks=False)
                    mine = uid < 0 or st.st_uid == uid
                    if stat.S_ISREG(st.st_mode) and mine and now - st.st_mtime > STALE_TEMP_S:
                        os.unlink(entry.path)
                        removed += 1
    except OSError:
        pass
    return removed


def write_text_atomic(path: PathLike, text: str) -> Path:
    """``write_atomic`` for UTF-8 text."""
    # A lone surrogate (from a JSON frontend) cannot be UTF-8: write it escaped, not fail.
    data = text.encode("utf-8", errors="backslashreplace")
    return write_atomic(path, lambda f: f.write(data))


# flock answers these where the file system cannot lock at all (Lustre mounted without
# -o flock: ENOSYS; NFS without lockd: ENOLCK; some FUSE file systems: EOPNOTSUPP).
_NO_LOCKS = {errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", -1)}


@dataclass
class Lock:
    """What ``locked`` could hold: ``held`` False (and ``why``) where locks are unavailable."""

    held: bool = True
    why: str = ""


@contextlib.contextmanager
def locked(path: PathLike, *, timeout_s: float = 2.0) -> Iterator[Lock]:
    """Hold an exclusive lock on the lock file ``path`` (created if missing, never followed
    through a link) so that two kernels saving the same file take turns. Waits at most
    ``timeout_s``, then raises ``OSError``. Where there are no locks (no ``fcntl``, as on
    Windows, or a file system that cannot lock) the block runs unlocked, and the ``Lock`` it
    is given says so: the atomic replace still keeps the file whole; only two saves at the
    very same moment could then lose one's keys."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on Linux
        yield Lock(False, "this system has no file locks")
        return
    text_path = _checked(path)
    flags = os.O_RDWR | os.O_CREAT | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC
    try:
        fd = os.open(text_path, flags, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise RefusedPath(text_path, "is a symbolic link; gpumem_nb does not follow "
                                         "links for its lock file") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise RefusedPath(text_path, f"is {_kind(mode)}, not a regular file")
        deadline = time.monotonic() + timeout_s
        lock = Lock()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise RefusedPath(text_path, f"stayed locked by another process for "
                                                 f"{timeout_s:g} s (another kernel saving)"
                                      ) from None
                time.sleep(0.01)
            except OSError as e:
                if e.errno not in _NO_LOCKS:
                    raise
                lock = Lock(False, f"this file system cannot lock files ({reason(e)})")
                break
        try:
            yield lock
        finally:
            if lock.held:
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
