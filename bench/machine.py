"""The machine line every benchmark prints, so recorded numbers always say where they were measured (and how busy the
machine was: a shared machine's other work moves every timing)."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import sys
from collections.abc import Iterator


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, or a note where the platform has none."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "load average unavailable"
    return f"load average {one:.2f} / {five:.2f} / {fifteen:.2f}"


def describe_machine() -> str:
    from rpx_plugins.system_card import cpu_model_name

    return (f"{cpu_model_name()} | {os.cpu_count()} logical CPUs | Python {platform.python_version()} | "
            f"{platform.platform()} | {load_average()}")


@contextlib.contextmanager
def busy_processes(count: int) -> Iterator[None]:
    """``count`` subprocesses spinning in a Python loop for the duration (none for 0): a machine busy with other work."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
