"""What every measured region shares, for the latency and batch-search stages alike."""

from __future__ import annotations

import contextlib
import gc
import signal
from collections.abc import Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Collect first, then pause Python's garbage collector while timing (as ``timeit`` does), so a collection
    triggered by the harness is not billed to one unlucky call. Timed calls then include no collection at all: the
    p50 of a model whose calls make reference cycles is their time without collecting them."""
    was_enabled = gc.isenabled()
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
    Held, it is delivered when the collection ends, into rpx's own code."""
    block = getattr(signal, "pthread_sigmask", None)  # not on Windows, which has no SIGALRM either
    if block is None:
        yield
        return
    previous = block(signal.SIG_BLOCK, {signal.SIGALRM})
    try:
        yield
    finally:
        block(signal.SIG_SETMASK, previous)
