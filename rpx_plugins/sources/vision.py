"""``torchvision:<name>`` and ``timm:<name>``: image-model architectures built by their libraries without weights.

The spec's ``config`` table and ``kwargs`` are the architecture's constructor arguments (``num_classes = 10``); inputs
are one floating tensor of batch x channels x height x width. torchvision wheels are built against one torch
version; one that does not import beside the installed torch is said so, with its error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rpx_core.plugin import InputSpec, ModelSource, RpxError, import_or_explain

TORCHVISION_INSTALL = "pip install torchvision (the release built for your torch version)"
TIMM_INSTALL = "pip install timm (it needs torchvision built for your torch version)"


def image_inputs(scheme: str) -> Any:
    def inputs(target: str, shape: tuple[int, ...], config: Mapping[str, Any]) -> tuple[InputSpec, ...]:
        if len(shape) != 4:
            raise RpxError(f"{scheme}: models take images of batch x channels x height x width (e.g. 1x3x224x224), "
                           f"got {'x'.join(map(str, shape))}")
        return (InputSpec(shape=shape),)

    return inputs


def build_torchvision(target: str, config: Mapping[str, Any], **kwargs: Any) -> Any:
    torchvision = import_or_explain("torchvision", "torchvision", TORCHVISION_INSTALL)
    known = torchvision.models.list_models()
    if target not in known:
        from rpx_core.plugin import did_you_mean

        raise RpxError(f"torchvision:{target}: torchvision has no model {target!r}{did_you_mean(target, known)}")
    return torchvision.models.get_model(target, weights=None, **{**config, **kwargs})


def build_timm(target: str, config: Mapping[str, Any], **kwargs: Any) -> Any:
    timm = import_or_explain("timm", "timm", TIMM_INSTALL)
    if not timm.is_model(target):
        from rpx_core.plugin import did_you_mean

        raise RpxError(f"timm:{target}: timm has no model {target!r}{did_you_mean(target, timm.list_models())}")
    return timm.create_model(target, pretrained=False, **{**config, **kwargs})


TORCHVISION = ModelSource(
    "torchvision",
    "torchvision architecture without weights (torchvision.models.get_model)",
    build=build_torchvision,
    inputs=image_inputs("torchvision"),
    requires=("torchvision",),
    install=TORCHVISION_INSTALL,
    example="resnet50",
)

TIMM = ModelSource(
    "timm",
    "timm architecture without weights (timm.create_model, pretrained=False)",
    build=build_timm,
    inputs=image_inputs("timm"),
    requires=("timm",),
    install=TIMM_INSTALL,
    example="vit_base_patch16_224",
)
