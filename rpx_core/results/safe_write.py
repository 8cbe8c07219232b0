"""Writing safely: only a regular file or a new path, never an input, never through a link, atomically, and one run
per output at a time. Every command that writes a file (``run``, ``profile --save-spec``, ``init``, ``report``,
``plot``) goes through here.

* :func:`check_target` refuses what must never be replaced: a device, a folder, a FIFO, a socket, a symbolic link, a
  read-only file, or any :class:`Input` (a file rpx reads: the spec, model code, GPU packs, plugin code; an input
  that is a folder protects everything in it). rpx_core.spec.inputs lists a command's inputs.
* :func:`check_writable` does what writing does first, and undoes it: it creates a file exclusively in the target's
  folder (or, for a folder still to be made, a folder in the nearest one that exists), so ``rpx validate`` finds an
  output under ``/proc`` or ``/sys`` unwritable exactly as ``rpx run`` would. :func:`check_output` is both checks:
  every command makes it before it writes anything.
* :func:`atomic_write` writes a temporary file created exclusively in the target's folder (``mkstemp``:
  ``O_CREAT | O_EXCL | O_NOFOLLOW``, a unique name, so the rename stays on one file system and no link is followed),
  flushes it to disk and renames it over the target.
* :class:`OutputLock` holds an exclusive lock (``flock``) on ``.<name>.lock`` beside the output for the whole run, so
  a second run on the same output is refused with the first one's process id instead of corrupting it. The lock
  file is only ever created exclusively (``O_EXCL | O_NOFOLLOW``): a link planted at its path is refused, never
  followed, and a lock its holder left behind (a killed run) is removed, not reused.
* :func:`path_safe` turns a name from a spec into one path component (``../../x`` cannot leave the output folder).
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path

import attrs

from rpx_core.errors import RpxError

#: Opening flags that never follow a link in the last component and never leak into a child process.
NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class OutputError(RpxError):
    """The output path cannot or must not be written; the message names it and why."""


@attrs.frozen
class Input:
    """A file (or a folder, with everything in it) that rpx reads, and what it is to the command, for the message
    that refuses to write over it: ``Input(Path("net.py"), "models[0].source")``."""

    path: Path
    role: str


def path_safe(name: str) -> str:
    """``name`` as a single, visible path component: anything but letters, digits, ``.``, ``_``, ``+`` and ``-``
    becomes ``_`` (separators and NUL included), and leading dots are dropped."""
    safe = re.sub(r"[^A-Za-z0-9._+-]", "_", name).lstrip(".")
    return safe or "_"


def same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def check_output(path: Path, inputs: Iterable[Input] = ()) -> None:
    """Raise OutputError unless ``path`` may be written: none of ``inputs``, a regular file or a new path, and its
    folder lets rpx create files (tried, then undone)."""
    check_target(path, inputs)
    check_writable(path)


def check_target(path: Path, inputs: Iterable[Input] = ()) -> None:
    """Raise OutputError unless ``path`` is a new path or an existing regular file rpx may replace, and no input."""
    refused = input_at(path, inputs)
    if refused is not None:
        where = "inside" if refused.path.is_dir() else "over"
        raise OutputError(f"{path}: refusing to write {where} {refused.path} ({refused.role}), which rpx reads")
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    except (OSError, ValueError) as exc:
        raise OutputError(f"cannot write {path}: {_reason(exc)}") from None
    if stat.S_ISLNK(info.st_mode):
        raise OutputError(f"{path}: is a symbolic link; give the path it points to, rpx replaces only regular files")
    if not stat.S_ISREG(info.st_mode):
        raise OutputError(f"{path}: is {kind_of(info.st_mode)}, not a regular file; rpx writes only to a regular "
                          "file or a new path")
    if not info.st_mode & 0o222 or not os.access(path, os.W_OK):  # mode bits too: root may write anything
        raise OutputError(f"{path}: is read-only; rpx does not replace a file it may not write")


def input_at(path: Path, inputs: Iterable[Input]) -> Input | None:
    """The input ``path`` is (the same file, under any name or link), else the input folder it lies in; None if
    it is none."""
    real = _real_path(path)
    folders = []
    for entry in inputs:
        other = _real_path(entry.path)
        if same_file(path, entry.path) or (real is not None and real == other):
            return entry
        if real is not None and other is not None and other.is_dir() and real.is_relative_to(other):
            folders.append(entry)
    return folders[0] if folders else None


def _real_path(path: Path) -> Path | None:
    """``path`` with every link resolved; None for a path the system cannot even look up (it is no input)."""
    try:
        return Path(os.path.realpath(path))
    except (OSError, ValueError):
        return None


def kind_of(mode: int) -> str:
    """What a file that is not a regular file is, for messages: "a FIFO", "a character device"."""
    for test, kind in ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return kind
    return "not a regular file"


def check_writable(path: Path) -> None:
    """Create, then remove, what writing ``path`` needs first: a file in its folder, or a folder in the nearest
    existing one when its folder is still to be made. OutputError saying why when the system refuses."""
    folder = path.parent
    nearest = folder
    while not nearest.exists() and nearest != nearest.parent:
        nearest = nearest.parent
    if not nearest.is_dir():
        raise OutputError(f"cannot write {path}: {nearest} is not a folder")
    try:
        if nearest == folder:
            descriptor, probe = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".probe")
            os.close(descriptor)
            os.unlink(probe)
        else:
            os.rmdir(tempfile.mkdtemp(dir=nearest, prefix=".rpx-probe-"))
    except OSError as exc:
        raise OutputError(f"cannot write {path}: cannot create anything in {nearest}: {_reason(exc)}") from None


def atomic_write(path: Path, content: str | bytes, inputs: Iterable[Input] = ()) -> Path:
    """Replace ``path`` with ``content`` in one rename: readers see the old file or the new one, never a torn one."""
    check_target(path, inputs)
    make_folder(path)
    data = content.encode("utf-8") if isinstance(content, str) else content
    try:
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {_reason(exc)}") from None
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
            os.fchmod(handle.fileno(), 0o666 & ~_umask())  # on the open file: never a path swapped in meanwhile
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
        raise OutputError(f"cannot write {path}: {_reason(exc)}") from None


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class OutputLock:
    """An exclusive lock on one output path for the life of a run (released when the process ends, however it ends).

    The lock file is created exclusively and holds the holder's process id. A second run finds it locked and is
    refused, naming that process. A lock file nobody holds (its run was killed) is removed and a new one created:
    rpx never writes into a file it did not just create. Whoever takes a lock checks afterwards that the path still
    names the file it locked (a holder removes the file on release, and a stale one is removed before it is
    replaced), and starts again if not, so two runs never both believe they hold the lock.
    """

    #: What a lock file may hold: a process id and a newline, or nothing yet (just created).
    CONTENT = re.compile(rb"\d{0,20}\n?")

    def __init__(self, output: Path) -> None:
        self.output = output
        self.path = output.with_name(f".{output.name}.lock")
        self._fd: int | None = None

    def acquire(self) -> OutputLock:
        make_folder(self.output)
        while True:
            fd = self._create()
            if fd is None:  # a lock file exists: refused if a live run holds it, else its run died
                fd = self._open_existing()
                if fd is not None:
                    self._lock_or_refuse(fd)
                    self._remove_stale(fd)
                continue
            self._lock_or_refuse(fd)
            if self._still_ours(fd):
                break
            os.close(fd)  # a run that found it before we locked it took it for stale and removed it: start again
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def _create(self) -> int | None:
        """The new lock file's descriptor, or None if one exists."""
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | NO_FOLLOW, 0o644)
        except FileExistsError:
            return None
        except OSError as exc:
            raise OutputError(f"cannot write {self.output}: cannot create {self.path}: {_reason(exc)}") from None

    def _open_existing(self) -> int | None:
        """The existing lock file, opened without following a link or blocking on a FIFO, if it is one rpx makes;
        None if it is gone already."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | NO_FOLLOW)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if os.path.islink(self.path):
                raise OutputError(f"{self.output}: its lock file {self.path} is a symbolic link; rpx never follows "
                                  "it: remove it if no rpx run is writing these results") from None
            raise OutputError(f"cannot write {self.output}: cannot open {self.path}: {_reason(exc)}") from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > 32 or not self.CONTENT.fullmatch(os.pread(fd, 33, 0)):
            os.close(fd)
            what = kind_of(info.st_mode) if not stat.S_ISREG(info.st_mode) else "not an rpx lock file"
            raise OutputError(f"{self.output}: its lock file {self.path} is {what}; remove it if no rpx run is "
                              "writing these results")
        return fd

    def _lock_or_refuse(self, fd: int) -> None:
        """Lock ``fd``; if a live run holds it, close it and refuse, naming that run."""
        import fcntl

        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise OutputError(f"{self.output}: another rpx run{f' (process {holder})' if holder else ''} is "
                              "writing these results; wait for it to finish or give another output (-o)") from None

    def _remove_stale(self, fd: int) -> None:
        """A lock file nobody holds, locked by us now: removed (if the path still names it), then closed."""
        if self._still_ours(fd):
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
        os.close(fd)

    def _still_ours(self, fd: int) -> bool:
        try:
            current = os.lstat(self.path)
        except FileNotFoundError:
            return False
        mine = os.fstat(fd)
        return (current.st_dev, current.st_ino) == (mine.st_dev, mine.st_ino)

    def release(self) -> None:
        if self._fd is None:
            return
        if self._still_ours(self._fd):
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
