"""Error types that the CLI turns into one clear line and a non-zero exit (a traceback only with --debug)."""

from __future__ import annotations

import difflib
from typing import Any, Iterable


class RpxError(Exception):
    """A problem the user can fix: bad spec, bad plugin, unavailable backend. Printed as one line, exit code 2."""

    exit_code = 2


class SpecError(RpxError):
    """The spec file is invalid; the message names the file and the key path."""


class PluginError(RpxError):
    """A plugin failed to load, misnamed a hook, or two plugins claim the same name."""


class BackendUnavailable(RpxError):
    """The spec selects a backend that cannot run on this machine; the message says why."""


class UnsupportedError(RpxError):
    """A stage cannot produce a figure for this model/backend/precision; said out loud instead of faking a zero."""


class StageFailed(RpxError):
    """A stage of ``rpx.profile`` failed (or was interrupted): the message names the stage and carries its error;
    ``result`` is the model's result with every stage record, ``stage`` the first stage that failed."""

    def __init__(self, message: str, *, stage: str, result: Any) -> None:
        super().__init__(message)
        self.stage = stage
        self.result = result


class NotApplicable(UnsupportedError):
    """A stage does not apply to this model (counting a model rpx cannot look inside, such as a client of a served
    model): recorded as ``not_applicable`` with the reason, neither a failure nor a zero."""


def closest(name: str, valid: Iterable[str], *, n: int = 1, cutoff: float = 0.6) -> list[str]:
    """The valid names closest to ``name``, best first (at most ``n``; none when nothing is close): the one
    similarity rule behind every "did you mean" rpx prints."""
    return difflib.get_close_matches(name, list(valid), n=n, cutoff=cutoff)


def did_you_mean(name: str, valid: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest valid name, or an empty string when nothing is close."""
    close = closest(name, valid)
    return f"; did you mean {close[0]!r}?" if close else ""


def choose_one_of(name: str, valid: Iterable[str]) -> str:
    """``"Choose one of: a, b, c"``: every valid name, the three closest to ``name`` first."""
    valid = sorted(valid)
    close = closest(name, valid, n=3)
    ordered = close + [v for v in valid if v not in close]
    return f"Choose one of: {', '.join(ordered)}" if ordered else "None is registered."
