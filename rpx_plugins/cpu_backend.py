"""The ``cpu`` backend (torch on the host): the default, always available when torch imports."""

from __future__ import annotations

import importlib.util

from rpx_core.backends import Availability, Backend
from rpx_core.hookspecs import hookimpl
from rpx_plugins.torch_backend import TorchBackend


class CpuBackend(TorchBackend):
    name = "cpu"
    description = "PyTorch on the host CPU"
    precisions = ("fp32", "bf16", "fp16")

    def probe(self) -> Availability:
        # find_spec, not import: the probe must stay cheap for `rpx backends`.
        if importlib.util.find_spec("torch") is None:
            return Availability(False, "torch is not installed")
        return Availability(True, "torch on the host CPU")

    def default_device(self) -> str:
        return "cpu"


@hookimpl
def rpx_register_backends() -> list[Backend]:
    return [CpuBackend()]
