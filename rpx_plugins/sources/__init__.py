"""The built-in model sources: ``hf:`` (Hugging Face transformers, from a configuration only), ``torchvision:`` and
``timm:`` (architectures without weights). Registered like a third-party plugin's; nothing heavy is imported here."""

from __future__ import annotations

from rpx_core.plugin import ModelSource, hookimpl
from rpx_plugins.sources import hf, vision


@hookimpl(trylast=True)
def rpx_register_model_sources() -> list[ModelSource]:
    return [hf.SOURCE, vision.TORCHVISION, vision.TIMM]
