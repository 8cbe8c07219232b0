"""Ships rpx's reference GPU pack (``packs/reference.toml``) like any third-party pack."""

from __future__ import annotations

from importlib.resources import files
from importlib.resources.abc import Traversable

from rpx_core.plugin import hookimpl


def reference_pack_path() -> Traversable:
    """The reference pack shipped inside rpx_plugins (a real path in a normal install; readable either way)."""
    return files("rpx_plugins.packs").joinpath("reference.toml")


@hookimpl
def rpx_register_gpu_packs() -> list[Traversable]:
    return [reference_pack_path()]
