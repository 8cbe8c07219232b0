"""One torch training step: the same code is counted on fake tensors and run on the device, so what rpx predicts is
what runs.

A step is ``accumulation_steps`` micro-batches, each ``forward`` (the model in train mode and the loss, under autocast
when the policy says so) and ``backward`` (``loss.backward()``, through the GradScaler at fp16 autocast), then the
``optimizer`` phase (``optimizer.step()``, or the scaler's unscale, step and update) and
``zero_grad(set_to_none=True)``. The model's outputs are dropped once the loss is computed, as a training loop that
keeps only the loss does; the graph keeps what backward needs. The loss is divided by ``accumulation_steps`` when there
are several, so accumulated gradients are a mean.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import attrs

from rpx_core.plugin import UnsupportedError, load_callable
from rpx_core.types.training import NAMED_LOSSES, TrainStepOptions

#: Named optimisers: (torch.optim class, rpx's default settings, which the spec's optimizer_settings override).
OPTIMIZERS: dict[str, tuple[str, dict[str, Any]]] = {
    "sgd": ("SGD", {"lr": 0.01, "momentum": 0.9}),
    "adam": ("Adam", {"lr": 1e-3}),
    "adamw": ("AdamW", {"lr": 1e-3, "weight_decay": 0.01}),
}
#: Precisions a torch training step runs at (others are counted for inference only).
TRAINABLE_PRECISIONS = ("fp32", "bf16", "fp16")
Phase = Callable[[str], None]


def no_phase(phase: str) -> None:
    """What a measured step reports its phases to: nobody."""


@attrs.frozen
class Policy:
    """How a precision trains: the parameters' dtype, and the autocast dtype (None: no autocast)."""

    name: str  # "fp32", "autocast" or "pure"
    parameter_dtype: Any
    autocast_dtype: Any | None

    @property
    def compute_dtype(self) -> Any:
        return self.autocast_dtype or self.parameter_dtype

    @property
    def input_precision(self) -> str:
        """The precision floating inputs are made at: the parameters' (autocast casts inside)."""
        return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[dtype_name(self.parameter_dtype)]


def dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def policy_for(precision: str, options: TrainStepOptions) -> Policy:
    import torch

    if precision not in TRAINABLE_PRECISIONS:
        raise UnsupportedError(f"train_step runs at {', '.join(TRAINABLE_PRECISIONS)}, not {precision!r} (tf32, fp8 and "
                               "int8 are counted and bounded for inference only)")
    if precision == "fp32":
        return Policy("fp32", torch.float32, None)
    low = torch.bfloat16 if precision == "bf16" else torch.float16
    if options.precision_policy == "pure":
        return Policy("pure", low, None)
    return Policy("autocast", torch.float32, low)


def optimizer_factory(options: TrainStepOptions) -> tuple[Callable[..., Any], dict[str, Any], str]:
    """(optimiser class, its settings, its name) for the options: a named one with rpx's defaults under the spec's
    settings, or the class an import path names, with the spec's settings only."""
    import torch

    chosen = options.optimizer or "adamw"
    if chosen in OPTIMIZERS:
        name, defaults = OPTIMIZERS[chosen]
        return getattr(torch.optim, name), {**defaults, **options.optimizer_settings}, f"torch.optim.{name}"
    cls = load_callable(chosen, what="options.train_step.optimizer")
    return cls, dict(options.optimizer_settings), f"{cls.__module__}.{cls.__qualname__}"


def device_default(cls: Any, settings: dict[str, Any], device_type: str) -> dict[str, Any]:
    """Settings that make an optimiser over fake tensors take the path it takes on ``device_type``: torch picks the
    multi-tensor ``foreach`` path only for real tensors on a foreach device (CUDA's default), so a fake count is told
    to, unless the user chose (``foreach`` or ``fused`` set) or the optimiser has no such path."""
    import inspect

    from torch.utils._foreach_utils import _get_foreach_kernels_supported_devices

    chosen = {"foreach", "fused"} & set(settings)
    takes = "foreach" in inspect.signature(cls).parameters
    if chosen or not takes or device_type not in _get_foreach_kernels_supported_devices():
        return settings
    return {**settings, "foreach": True}


def make_optimizer(model: Any, options: TrainStepOptions, fake_device: str | None = None) -> tuple[Any, str, dict]:
    """The optimiser over the model's trainable parameters; counted on fake tensors of ``fake_device``, with the
    device's default path (:func:`device_default`)."""
    cls, settings, name = optimizer_factory(options)
    if fake_device is not None:
        settings = device_default(cls, settings, fake_device)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise UnsupportedError("train_step: the model has no trainable parameters (all frozen?)")
    try:
        return cls(params, **settings), name, settings
    except TypeError as exc:
        raise UnsupportedError(f"options.train_step.optimizer_settings: {name} does not take them: {exc}") from None


def logits_of(outputs: Any) -> tuple[Any, bool]:
    """The tensor a default loss reads, and whether it is logits: a ``logits`` field (Hugging Face outputs), else the
    output itself or the first floating tensor in whatever the model returns; a 2-D tensor counts as logits."""
    import torch

    from rpx_plugins.torch.counter.containers import tensors_within

    logits = getattr(outputs, "logits", None)
    if logits is None and isinstance(outputs, dict):
        logits = outputs.get("logits")
    if isinstance(logits, torch.Tensor):
        return logits, True
    floating = [t for t in tensors_within(outputs) if t.is_floating_point()]
    if not floating:
        raise UnsupportedError("train_step: the model returns no floating tensor to compute a default loss from; "
                               "give options.train_step.loss as an import path")
    first = floating[0]
    return first, first.dim() == 2 and first.shape[-1] > 1


class DefaultLoss:
    """Cross-entropy against random class targets, or mean squared error against a random target of the output's
    shape; the targets are made on the first call, from the output's shape, and kept (like the inputs)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind  # "auto", "cross_entropy" or "mse"
        self.targets: Any = None
        self.description = kind

    def __call__(self, outputs: Any) -> Any:
        import torch
        import torch.nn.functional as F

        tensor, is_logits = logits_of(outputs)
        kind = self.kind if self.kind != "auto" else ("cross_entropy" if is_logits else "mse")
        shape = list(tensor.shape)
        if self.targets is None:  # made from the output (new_empty, randn_like): fake with fake tensors, on its device
            with torch.no_grad():
                if kind == "cross_entropy":
                    self.targets = tensor.new_empty(shape[:-1], dtype=torch.long).random_(0, shape[-1])
                else:
                    self.targets = torch.randn_like(tensor)
            what = ("auto: logits" if kind == "cross_entropy" else "auto: output") if self.kind == "auto" else "output"
            self.description = f"{kind} ({what} {shape}, random targets)"
        if kind == "cross_entropy":
            return F.cross_entropy(tensor.flatten(0, -2), self.targets.flatten())
        return F.mse_loss(tensor, self.targets)


def make_loss(options: TrainStepOptions) -> tuple[Callable[[Any], Any], Callable[[], str]]:
    """The loss and how to describe it once it ran."""
    if options.loss in NAMED_LOSSES:
        loss = DefaultLoss(options.loss)
        return loss, lambda: loss.description
    function = load_callable(options.loss, what="options.train_step.loss")
    return function, lambda: f"{options.loss} (user's)"


@attrs.define
class TorchStep:
    """Everything one step needs, built once; ``__call__`` runs one whole step."""

    model: Any
    optimizer: Any
    loss: Callable[[Any], Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    policy: Policy
    device_type: str
    accumulation: int
    scaler: Any = None  # torch.amp.GradScaler at fp16 autocast
    #: Counting on fake tensors: the scaler's skip-if-inf check reads a value (``.item()``), which fake tensors do not
    #: have; the counted step unscales and steps unconditionally instead (the same operators, without the check).
    fake: bool = False

    def autocast(self) -> contextlib.AbstractContextManager:
        import torch

        if self.policy.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.policy.autocast_dtype)

    def __call__(self, on_phase: Phase = no_phase) -> None:
        for _ in range(self.accumulation):
            on_phase("forward")
            with self.autocast():
                outputs = self.model(*self.args, **self.kwargs)
                loss = self.loss(outputs)
                del outputs
                if self.accumulation > 1:
                    loss = loss / self.accumulation
            on_phase("backward")
            (loss if self.scaler is None else self.scaler.scale(loss)).backward()
            del loss
        on_phase("optimizer")
        self.update()
        self.optimizer.zero_grad(set_to_none=True)

    def update(self) -> None:
        if self.scaler is None:
            self.optimizer.step()
        elif self.fake:
            self.scaler.unscale_(self.optimizer)
            self.optimizer.step()
            self.scaler.update()
        else:
            self.scaler.step(self.optimizer)
            self.scaler.update()

    def resident_tensors(self) -> dict[str, list[Any]]:
        """What the step keeps between steps, by kind (the optimiser's state exists after the first step)."""
        import torch

        from rpx_plugins.torch.counter.containers import tensors_within

        state = [t for t in tensors_within(list(self.optimizer.state.values())) if isinstance(t, torch.Tensor)]
        targets = getattr(self.loss, "targets", None)
        return {
            "parameters": list(self.model.parameters()),
            "buffers": list(self.model.buffers()),
            "optimizer_state": state,
            "batch": [*tensors_within((self.args, self.kwargs)), *([] if targets is None else [targets])],
        }


def build_step(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], policy: Policy, device_type: str,
               options: TrainStepOptions, fake: bool = False) -> tuple[TorchStep, str, dict[str, Any], Callable[[], str]]:
    """The step for a placed model (at the policy's parameter dtype, on its device) and its inputs; the model is put
    in train mode. Returns the step, the optimiser's name and settings, and the loss's description."""
    import torch

    model.train()
    optimizer, name, settings = make_optimizer(model, options, device_type if fake else None)
    loss, describe = make_loss(options)
    scaler = None
    if policy.autocast_dtype == torch.float16:
        scaler = torch.amp.GradScaler(device_type)
    step = TorchStep(model, optimizer, loss, args, kwargs, policy, device_type, options.accumulation_steps, scaler, fake)
    return step, name, settings, describe
