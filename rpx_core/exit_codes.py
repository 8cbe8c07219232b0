"""The exit codes of every ``rpx`` command: documented, stable, and the same with ``--debug`` (which only adds a
traceback).

====  ===========================================================================================================
code  meaning
====  ===========================================================================================================
0     everything asked for succeeded
1     the run finished but a stage or a job failed (crashed, timed out, raised); the results file says which
2     bad input: the spec, the command line, a plugin, an output path; nothing was run
3     a bug in rpx (an unexpected exception outside any stage); please report it with ``--debug``'s traceback
130   interrupted by SIGINT (Ctrl-C); what finished is in the results file, ``rpx run --resume`` continues
143   terminated by SIGTERM; as for 130
====  ===========================================================================================================
"""

from __future__ import annotations

import enum
import signal


class ExitCode(enum.IntEnum):
    OK = 0
    FAILED = 1
    BAD_INPUT = 2
    INTERNAL = 3
    SIGINT = 128 + signal.SIGINT
    SIGTERM = 128 + signal.SIGTERM


def for_signal(signum: int) -> ExitCode:
    """The exit code of a run stopped by ``signum`` (SIGTERM -> 143, anything else interrupting -> 130)."""
    return ExitCode.SIGTERM if signum == signal.SIGTERM else ExitCode.SIGINT
