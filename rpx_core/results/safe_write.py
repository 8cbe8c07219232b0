"""Writing results safely: only ever a regular file or a new path, never an input of the run, atomically, and one
run per output at a time.

* :func:`check_target` refuses what must never be replaced: a device, a folder, a FIFO, a symbolic link, a read-only
  file, or any file the run reads (the spec, model files, GPU packs).
* :func:`atomic_write` writes a unique temporary file in the target's folder (so the rename stays on one file system
  and two processes never share a temporary name), flushes it to disk and renames it over the target.
* :class:`OutputLock` holds an exclusive lock (``flock``) on ``.<name>.lock`` beside the output for the whole run, so
  a second run on the same output is refused with the first one's process id instead of corrupting it.
* :func:`path_safe` turns a name from a spec into one path component (``../../x`` cannot leave the output folder).
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path

from rpx_core.errors import RpxError


class OutputError(RpxError):
    """The output path cannot or must not be written; the message names it and why."""


def path_safe(name: str) -> str:
    """``name`` as a single, visible path component: anything but letters, digits, ``.``, ``_``, ``+`` and ``-``
    becomes ``_`` (separators and NUL included), and leading dots are dropped."""
    safe = re.sub(r"[^A-Za-z0-9._+-]", "_", name).lstrip(".")
    return safe or "_"


def same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_target(path: Path, protected: Iterable[Path] = ()) -> None:
    """Raise OutputError unless ``path`` is a new path or an existing regular file rpx may replace."""
    for other in protected:
        if same_file(path, other) or Path(os.path.abspath(path)) == Path(os.path.abspath(other)):
            raise OutputError(f"{path}: refusing to write results over {other}, which the run reads")
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OutputError(f"cannot write results to {path}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(info.st_mode):
        raise OutputError(f"{path}: is a symbolic link; give the path it points to, rpx replaces only regular files")
    if not stat.S_ISREG(info.st_mode):
        raise OutputError(f"{path}: is {_kind(info.st_mode)}, not a regular file; rpx writes results only to a "
                          "regular file or a new path")
    if not info.st_mode & 0o222 or not os.access(path, os.W_OK):  # mode bits too: root may write anything
        raise OutputError(f"{path}: is read-only; rpx does not replace a file it may not write")


def _kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a regular file"


def atomic_write(path: Path, text: str, protected: Iterable[Path] = ()) -> Path:
    """Replace ``path`` with ``text`` in one rename: readers see the old file or the new one, never a torn one."""
    check_target(path, protected)
    make_folder(path)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o666 & ~_umask())
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    return path


def make_folder(path: Path) -> None:
    """Create the folder ``path`` goes in; failing that, say so about ``path``."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot write results to {path}: {exc.strerror or exc}") from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class OutputLock:
    """An exclusive lock on one output path for the life of a run (released when the process ends, however it ends).

    The lock file is removed on release; a process that opened the old file before its removal notices that the
    path now names another file and retries, so two runs never both believe they hold the lock.
    """

    def __init__(self, output: Path) -> None:
        self.output = output
        self.path = output.with_name(f".{output.name}.lock")
        self._fd: int | None = None

    def acquire(self) -> OutputLock:
        import fcntl

        make_folder(self.output)
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise OutputError(f"cannot write results to {self.output}: {exc.strerror or exc}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_pid(fd)
                os.close(fd)
                raise OutputError(f"{self.output}: another rpx run{f' (process {holder})' if holder else ''} is "
                                  "writing these results; wait for it to finish or give another output (-o)") from None
            try:
                current = os.stat(self.path)
            except FileNotFoundError:
                current = None
            if current is not None and current.st_ino == os.fstat(fd).st_ino:
                break
            os.close(fd)  # the holder removed the file between our open and our lock: try the new one
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.unlink(self.path)
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_pid(fd: int) -> str:
    try:
        return os.pread(fd, 32, 0).decode().strip()
    except (OSError, UnicodeDecodeError):
        return ""
