"""SIGINT and SIGTERM as one exception, so a run stops the same clean way for both: the running stage is recorded as
interrupted (with whatever it hands back), the results file is written, and the exit code says which signal it was.

A stage that can keep part of its work (batch_search's finished trials) catches ``KeyboardInterrupt`` (``Interrupted``
is one) and re-raises :func:`with_partial` of it; the engine then records that partial result with status
"interrupted".
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


class Interrupted(KeyboardInterrupt):
    """The run was asked to stop by ``signum``; ``partial`` is what the interrupted stage finished, if it said;
    ``unfinished`` the jobs of the run that did not finish (set by the pipeline, for the message that ends rpx)."""

    def __init__(self, signum: int = signal.SIGINT, partial: Any = None, unfinished: tuple[str, ...] = ()) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.partial = partial
        self.unfinished = unfinished


def signal_of(interrupt: BaseException) -> int:
    return getattr(interrupt, "signum", signal.SIGINT)


def with_partial(interrupt: BaseException, partial: Any) -> Interrupted:
    """The same interruption, carrying ``partial`` (a result of the interrupted stage's type) to be recorded."""
    return Interrupted(signal_of(interrupt), partial)


def _raise(signum: int, frame: Any) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise :class:`Interrupted` in the main thread (elsewhere: no change)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, _raise) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
