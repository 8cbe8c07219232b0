"""Small models whose FLOPs are easy to compute by hand, for the sweep and executor tests."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import torch


class TokenLinear(torch.nn.Module):
    """Embedding(100, 8) then Linear(8, 4, bias=False): matrix FLOPs = 2 x batch x seq x 8 x 4."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(100, 8)
        self.proj = torch.nn.Linear(8, 4, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.proj(self.embed(tokens))


def token_linear() -> torch.nn.Module:
    return TokenLinear()


def conv() -> torch.nn.Module:
    """Conv2d(3, 4, 3, padding=1, bias=False): matrix FLOPs = 2 x batch x R x R x 4 x 3 x 9 at resolution R."""
    return torch.nn.Conv2d(3, 4, 3, padding=1, bias=False)


def dies_once(marker: str) -> torch.nn.Module:
    """Kills the process building it the first time (the file ``marker`` does not exist yet), then builds."""
    if not Path(marker).exists():
        Path(marker).write_text("killed once")
        os.kill(os.getpid(), signal.SIGKILL)
    return token_linear()


def always_dies() -> torch.nn.Module:
    """Kills the process building it, every time."""
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


def pid_linear(log: str, default_dtype: str | None = None) -> torch.nn.Module:
    """A TokenLinear that appends the building process's id (and its default dtype) to ``log``, and optionally sets
    torch's default dtype, a process-wide mode a reused worker must not pass on to the next job."""
    with open(log, "a") as handle:
        handle.write(f"{os.getpid()} {str(torch.get_default_dtype()).removeprefix('torch.')}\n")
    if default_dtype is not None:
        torch.set_default_dtype(getattr(torch, default_dtype))
    return token_linear()


def dies_in_worker(log: str) -> torch.nn.Module:
    """Logs like pid_linear, then kills the process building it."""
    pid_linear(log)
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


def slow_linear(seconds: float) -> torch.nn.Module:
    """A TokenLinear that takes ``seconds`` to build: a sweep long enough to be killed in the middle."""
    import time

    time.sleep(seconds)
    return token_linear()



def rng_width(log: str) -> torch.nn.Module:
    """Linear(8, n) with n drawn from torch's and Python's global generators, as weights and inputs are drawn: every
    job of a worker must start from the generators' state a fresh worker has. Appends the process id to ``log``."""
    import random

    with open(log, "a") as handle:
        handle.write(f"{os.getpid()}\n")
    width = 1 + int(torch.randint(0, 50, (), device="cpu")) + random.randrange(50)
    return torch.nn.Linear(8, width, bias=False)


class RaisesInForward(TokenLinear):
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("broken forward")


def raises_in_forward(log: str) -> torch.nn.Module:
    """Logs like pid_linear; its forward raises, so counting FLOPs fails (a stage failure, not a crash)."""
    pid_linear(log)
    return RaisesInForward()


def counts_live_workers(log: str, watch: str) -> torch.nn.Module:
    """A TokenLinear that appends to ``log`` how many of the processes listed in ``watch`` (pid_linear's log) are
    still alive, itself left out."""
    alive = 0
    for pid in {int(line.split()[0]) for line in Path(watch).read_text().splitlines()} - {os.getpid()}:
        try:
            os.kill(pid, 0)
            alive += 1
        except ProcessLookupError:
            pass
    with open(log, "a") as handle:
        handle.write(f"{alive}\n")
    return token_linear()


def logs_where_built(log: str) -> torch.nn.Module:
    """A TokenLinear that appends "ray" to ``log`` when a Ray worker builds it, else "rpx" (rpx's own workers)."""
    import sys

    ray = sys.modules.get("ray")
    with open(log, "a") as handle:
        handle.write("ray\n" if ray is not None and ray.is_initialized() else "rpx\n")
    return token_linear()
