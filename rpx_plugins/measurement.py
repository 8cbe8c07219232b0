"""What every measured region shares, for the latency and batch-search stages alike."""

from __future__ import annotations

import contextlib
import gc
import signal
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def gc_paused(collect: bool = True) -> Iterator[None]:
    """Pause Python's garbage collector while timing (as ``timeit`` does), so a collection triggered by the harness
    is not billed to one unlucky call, after collecting first when ``collect`` (so a region's memory starts without
    the garbage of earlier ones; on a busy machine with torch loaded a full collection takes seconds). Timed calls
    then include no collection at all: the p50 of a model whose calls make reference cycles is their time without
    collecting them."""
    was_enabled = gc.isenabled()
    if collect:
        with alarm_held():
            gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextlib.contextmanager
def alarm_held() -> Iterator[None]:
    """Hold SIGALRM back while the garbage collector runs finalizers: an in-process stage timeout (SIGALRM) whose
    handler ran inside a ``__del__`` would raise there, where Python ignores exceptions, and the stage would run on.
    Held (its handler swapped for one that only notes it), it is handed to the real handler when the collection
    ends, in rpx's own code. Python runs signal handlers in the main thread only, so elsewhere nothing is held."""
    alarm = getattr(signal, "SIGALRM", None)  # Windows has none
    if alarm is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[tuple[int, Any]] = []
    previous = signal.signal(alarm, lambda signum, frame: fired.append((signum, frame)))
    try:
        yield
    finally:
        signal.signal(alarm, previous)
        if fired and callable(previous):
            previous(*fired[0])
