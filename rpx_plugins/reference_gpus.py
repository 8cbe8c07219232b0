"""Ships rpx's reference GPU pack (``packs/reference.toml``) like any third-party pack."""

from __future__ import annotations

from typing import Any

from rpx_core.gpus import reference_pack_path
from rpx_core.hookspecs import hookimpl


@hookimpl
def rpx_register_gpu_packs() -> list[Any]:
    return [reference_pack_path()]
