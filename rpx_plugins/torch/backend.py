"""What every torch backend (cpu, cuda, mps) shares: precision -> dtype, model placement, input creation.

Only imported by backend plugins; torch itself is imported inside methods.
"""

from __future__ import annotations

import contextlib
from typing import Any

from rpx_core.plugin import (
    FLOAT_DTYPES,
    PRECISIONS,
    Backend,
    InputSpec,
    ModelSpec,
    UnsupportedError,
    load_callable,
    precision_of_dtype,
)

#: Storage dtype used to *execute* at each precision (rpx_core.precision). tf32 stores fp32 and only changes how
#: matmuls compute.
EXECUTION_DTYPES = {name: dtype for name, precision in PRECISIONS.items() if (dtype := precision.dtype("torch"))}


def torch_dtype(precision: str) -> Any:
    import torch

    try:
        return getattr(torch, EXECUTION_DTYPES[precision])
    except KeyError:
        raise UnsupportedError(
            f"precision {precision!r} cannot be executed by torch backends (roofline bounds for it still work); "
            f"executable precisions: {', '.join(EXECUTION_DTYPES)}"
        ) from None


def input_dtype(spec_input: InputSpec, precision: str) -> Any:
    """Floating inputs follow the precision (an fp16 model takes fp16 activations); integer inputs keep their dtype."""
    import torch

    if spec_input.dtype in FLOAT_DTYPES and precision in EXECUTION_DTYPES:
        return torch_dtype(precision)
    return getattr(torch, spec_input.dtype)


def make_tensor(spec_input: InputSpec, batch_size: int | None, precision: str, device: str) -> Any:
    import torch

    shape = spec_input.with_batch(batch_size).shape
    dtype = input_dtype(spec_input, precision)
    if device == "meta":
        return torch.empty(shape, dtype=dtype, device="meta")
    if dtype.is_floating_point:
        return torch.randn(shape, dtype=dtype, device=device)
    if dtype == torch.bool:
        return torch.zeros(shape, dtype=dtype, device=device)
    return torch.randint(0, spec_input.high or 2, shape, dtype=dtype, device=device)


def make_inputs(
    model: ModelSpec, batch_size: int | None, precision: str, device: str
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Inputs from shapes (``batch_size`` None: as written; a named input is passed as that keyword argument), or
    from the model's input_factory(batch_size=, device=, dtype=), which gets 1 for None (see factory_inputs)."""
    if model.input_factory:
        factory = load_callable(model.input_factory, what=f"model {model.name!r} input_factory")
        made = factory(batch_size=batch_size or 1, device=device, dtype=torch_dtype(precision))
        return factory_inputs(made)
    args = tuple(make_tensor(i, batch_size, precision, device) for i in model.inputs if i.name is None)
    kwargs = {i.name: make_tensor(i, batch_size, precision, device) for i in model.inputs if i.name is not None}
    return args, kwargs


def factory_inputs(made: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """An input_factory's return value as (positional, keyword) inputs. Its forms: a dict (keyword arguments, as
    Hugging Face models take them), a pair (a tuple or list of positional inputs, a dict of keyword arguments), a
    tuple or list (positional inputs), or one object (the only positional input)."""
    if isinstance(made, dict):
        return (), dict(made)
    if isinstance(made, (tuple, list)) and len(made) == 2 and isinstance(made[0], (tuple, list)) and isinstance(made[1], dict):
        return tuple(made[0]), dict(made[1])
    return (tuple(made) if isinstance(made, (tuple, list)) else (made,)), {}


class TorchBackend(Backend):
    """Base for torch backends: placement and inputs are the same everywhere, only the device differs."""

    framework = "torch"
    #: torch, and what the counting pass imports on first use (dynamo, fake tensors: about 4 s on a small CPU).
    worker_preload = ("torch", "torch._dynamo", "torch._subclasses.fake_tensor", "rpx_plugins.torch.counter")

    def device_problem(self, device: str) -> str | None:
        """torch names a device of this backend ``<name>`` or ``<name>:<index>``."""
        kind, _, index = device.partition(":")
        if kind == self.name and (not index or index.isdigit()):
            return None
        return f"{device!r} is not a device of backend {self.name!r} (expected {self.name!r} or '{self.name}:<index>')"

    def object_precision(self, model: Any) -> str | None:
        """The precision of a module's first floating parameter (fp32, fp16, bf16 or fp8); None for other objects."""
        import torch

        if not isinstance(model, torch.nn.Module):
            return None
        floating = next((p for p in model.parameters() if p.is_floating_point()), None)
        return None if floating is None else precision_of_dtype(str(floating.dtype))

    def place_model(self, model: Any, precision: str, device: str) -> Any:
        """A torch.nn.Module in eval mode on ``device`` at ``precision``; any other callable (a client of a served
        model) is called as it is, with inputs made on ``device`` at ``precision``."""
        import torch

        if precision not in self.precisions:
            raise UnsupportedError(f"backend {self.name!r} cannot execute precision {precision!r}; it supports {', '.join(self.precisions)}")
        if not isinstance(model, torch.nn.Module):
            if callable(model):
                return model
            raise UnsupportedError(f"backend {self.name!r} runs torch.nn.Module models or callables, got "
                                   f"{type(model).__name__}")
        return model.eval().to(device=device, dtype=torch_dtype(precision))

    def thread_settings(self) -> dict[str, int]:
        import torch

        return {"torch_intra_op": torch.get_num_threads(), "torch_inter_op": torch.get_num_interop_threads()}

    def input_dtype_name(self, spec_input: InputSpec, precision: str) -> str:
        return str(input_dtype(spec_input, precision)).removeprefix("torch.")

    def inference_context(self) -> contextlib.AbstractContextManager:
        import torch

        return torch.inference_mode()

    def make_inputs(self, model: ModelSpec, batch_size: int | None, precision: str, device: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return make_inputs(model, batch_size, precision, device)
