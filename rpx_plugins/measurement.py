"""What every measured region shares, for the latency and batch-search stages alike."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Collect first, then pause Python's garbage collector while timing (as ``timeit`` does), so a collection
    triggered by the harness is not billed to one unlucky call. Timed calls then include no collection at all: the
    p50 of a model whose calls make reference cycles is their time without collecting them."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
