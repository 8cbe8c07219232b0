"""The zygote: a fresh interpreter that imports the framework and rpx's plugins once, then forks workers on request.

rpx's side (:class:`Zygote`, and :class:`Worker`, its handle on one forked worker: job channel, process group,
stderr) and the zygote's own loop (:func:`main`). A forked worker inherits the imports, so no job pays for importing
torch again, and starts as a fresh copy of a process that never ran user code. (Not multiprocessing's forkserver: that
re-imports the caller's ``__main__`` script in every worker.)"""

from __future__ import annotations

import atexit
import collections
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import traceback
from multiprocessing.connection import Connection
from typing import Any

from rpx_core.execution.stage_loop import _preload
from rpx_core.execution.worker import _LOADED, _load, serve_jobs

#: How much of a dead worker's stderr is kept in its stage record.
STDERR_TAIL_CHARS = 4000

_TIMEOUT, _DEAD = object(), object()  # what Worker.next_event returns instead of an event


class ZygoteLost(RuntimeError):
    """The zygote died (the out-of-memory killer, or a model's code killing its parent): it forks no more workers
    and knows no exit status any more; :meth:`Zygote.shared` starts a new one. Workers it forked run on."""


class Worker:
    """One forked worker as seen from rpx: its job channel, its process group, its stderr (forwarded and kept)."""

    def __init__(self, zygote: Zygote, pid: int, connection: Connection, stderr_fd: int) -> None:
        self.zygote, self.pid, self.connection = zygote, pid, connection
        self._tail: collections.deque[str] = collections.deque()
        self._tail_chars = 0
        self._tail_lock = threading.Lock()  # the reader thread appends while begin_task may clear
        self._exitcode: int | None = None
        self._reader = threading.Thread(target=self._forward, args=(stderr_fd,), daemon=True, name=f"rpx-stderr-{pid}")
        self._reader.start()

    def begin_task(self) -> None:
        """A new task starts in this worker: its stderr tail starts afresh."""
        with self._tail_lock:
            self._tail.clear()
            self._tail_chars = 0

    def next_event(self, timeout: float) -> Any:
        """The next event, ``None`` when the task is done, ``_TIMEOUT`` or ``_DEAD``."""
        try:
            if not self.connection.poll(None if timeout == float("inf") else timeout):
                return _TIMEOUT
            return self.connection.recv()
        except (EOFError, OSError):
            return _DEAD

    def signal(self, signum: int) -> None:
        try:
            os.killpg(self.pid, signum)
        except OSError:
            pass

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def wait(self) -> int | None:
        """The worker's exit status (killed by a signal: its negative number); None when the zygote that forked it
        died, and with it the status."""
        if self._exitcode is None:
            self._exitcode = self.zygote.wait(self.pid)
        return self._exitcode

    def stderr_tail(self) -> str:
        self._reader.join(timeout=2.0)
        with self._tail_lock:
            return "".join(self._tail)[-STDERR_TAIL_CHARS:]

    def close(self) -> None:
        self.kill()
        self.wait()
        self.connection.close()
        self._reader.join(timeout=2.0)

    def _forward(self, fd: int) -> None:
        """Copy the worker's output to our stderr as it comes, keeping the last few thousand characters."""
        with os.fdopen(fd, "rb", buffering=0) as pipe:
            while chunk := pipe.read(65536):
                text = chunk.decode(errors="replace")
                try:
                    sys.stderr.write(text)
                    sys.stderr.flush()
                except (OSError, ValueError):
                    pass
                with self._tail_lock:
                    self._tail.append(text)
                    self._tail_chars += len(text)
                    while len(self._tail) > 1 and self._tail_chars - len(self._tail[0]) > STDERR_TAIL_CHARS:
                        self._tail_chars -= len(self._tail.popleft())


class Zygote:
    """A fresh interpreter running :func:`rpx_core.execution.zygote.main`, started once per rpx process and reused: it forks
    the workers. (Not multiprocessing's forkserver: that re-imports the caller's ``__main__`` script in every worker.)"""

    _shared: Zygote | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        command = [sys.executable, "-c", "from rpx_core.execution.zygote import main; main()", str(theirs.fileno())]
        self.process = subprocess.Popen(command,
                                        pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=dict(os.environ))
        theirs.close()
        self.control = ours
        self.lost = False  # its control socket failed or was closed: it is gone, or going

    @classmethod
    def shared(cls) -> Zygote:
        with cls._lock:
            if cls._shared is None or cls._shared.gone():
                cls._shared = cls()
                atexit.register(cls._shared.close)
            return cls._shared

    def gone(self) -> bool:
        return self.lost or self.process.poll() is not None

    def death(self) -> str:
        """How the zygote ended, in words, for the records of the workers it can no longer tell about."""
        try:
            code = self.process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            code = None
        if code is None:
            return f"rpx's worker zygote (process {self.process.pid}, which forks the workers) stopped answering"
        how = f"was killed by signal {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        return (f"rpx's worker zygote (process {self.process.pid}, which forks the workers) {how} (the out-of-memory "
                "killer, or a model's code killing its parent process)")

    def start(self, preload: tuple[str, ...], disabled: tuple[str, ...] = ()) -> Worker:
        """Fork a worker, importing ``preload`` and loading the plugin set without ``disabled`` in the zygote first
        (once), so the worker inherits both."""
        ours, theirs = socket.socketpair()
        stderr_read, stderr_write = os.pipe()
        request = {"op": "fork", "preload": list(preload), "disabled": list(disabled)}
        try:
            with self._lock:
                self._check()
                socket.send_fds(self.control, [json.dumps(request).encode()],
                                [theirs.fileno(), stderr_write])
                pid = json.loads(self._reply())["pid"]
        except BaseException as exc:  # interrupted mid-request: its reply would confuse the next one, so start afresh
            self.close(timeout=0)
            ours.close()
            os.close(stderr_read)
            if isinstance(exc, OSError):
                raise ZygoteLost(self.death()) from None
            raise
        finally:
            theirs.close()
            os.close(stderr_write)
        return Worker(self, pid, Connection(ours.detach()), stderr_read)

    def wait(self, pid: int) -> int | None:
        """Worker ``pid``'s exit status, once it has ended; None when this zygote is gone (and the status with it)."""
        try:
            with self._lock:
                self._check()
                self.control.send(json.dumps({"op": "wait", "pid": pid}).encode())
                return json.loads(self._reply())["exitcode"]
        except (OSError, ZygoteLost):
            self.lost = True
            return None

    def _check(self) -> None:
        if self.lost:
            raise ZygoteLost(self.death())

    def _reply(self) -> bytes:
        reply = self.control.recv(65536)
        if not reply:
            self.lost = True
            raise ZygoteLost(self.death())
        return reply

    def close(self, timeout: float = 1.0) -> None:
        """End the zygote: told to, it kills any worker it forked that still runs and exits; one that does not exit
        within ``timeout`` seconds (busy importing the framework, say) is killed (0: at once, which also ends the
        wait of any thread between a request and its reply). The next run starts a new one."""
        self.lost = True
        if timeout <= 0:
            self.process.kill()
        with self._lock:  # never while another thread is between a request and its reply
            self.control.close()
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if Zygote._shared is self:
            Zygote._shared = None


# -- the zygote process ----------------------------------------------------------------------------------------------

def zygote(control: socket.socket) -> None:
    """Fork one worker per request (a JSON message with the job channel and stderr pipe as file descriptors); report
    exit statuses on request. Exits, killing what it started, when the parent goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the parent, which stops the workers itself
    children: set[int] = set()
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(control, 65536, 2)
        except OSError:
            message, fds = b"", []
        if not message:
            break
        request = json.loads(message)
        if request["op"] == "fork":
            for module in request.get("preload", ()):
                _preload(module)
            disabled = tuple(request.get("disabled", ()))
            if disabled not in _LOADED:
                try:
                    _LOADED[disabled] = _load(disabled)
                except Exception:
                    pass  # the worker loads them itself, and says what fails
            gc.freeze()  # what the zygote imported is permanent: a worker's collections never walk torch's objects
            pid = os.fork()
            if pid == 0:
                control.close()
                _become_worker(*fds)
            for fd in fds:
                os.close(fd)
            children.add(pid)
            control.send(json.dumps({"pid": pid}).encode())
        elif request["op"] == "wait":
            pid = request["pid"]
            _, status = os.waitpid(pid, 0)
            children.discard(pid)
            control.send(json.dumps({"exitcode": os.waitstatus_to_exitcode(status)}).encode())
    for pid in children:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass


def _become_worker(job_fd: int, stderr_fd: int) -> None:
    """In the forked child: own process group (signalled and killed as one), stdout and stderr into the parent's
    pipe, then the job; never returns into the zygote's loop."""
    from multiprocessing.connection import Connection

    code = 0
    try:
        os.setpgrp()
        os.dup2(stderr_fd, 1)
        os.dup2(stderr_fd, 2)
        os.close(stderr_fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        serve_jobs(Connection(job_fd))
    except BaseException:
        traceback.print_exc()
        code = 70
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def main() -> None:
    """The zygote's entry point (started by :class:`Zygote` with the control socket's descriptor as argument)."""
    import rpx_core.registry.manager as plugins

    for module in plugins.BUILTIN.values():  # light (heavy imports are inside hooks); every worker needs them
        _preload(module)
    zygote(socket.socket(fileno=int(sys.argv[1])))
