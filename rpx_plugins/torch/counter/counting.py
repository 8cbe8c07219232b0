"""One counted pass: the dispatch mode that sees every aten operator, the forward, the backward, the report."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from rpx_core.plugin import OpFormula, UnsupportedError
from rpx_plugins.torch.counter.containers import tensors_within
from rpx_plugins.torch.counter.fast_paths import CpuAttentionOnMeta
from rpx_plugins.torch.counter.formulas import ATTENTION_BACKWARD_CONVENTIONS, ATTENTION_BACKWARD_WITH_RECOMPUTE
from rpx_plugins.torch.counter.ledger import Ledger
from rpx_plugins.torch.counter.meta_outputs import MetaOutputs
from rpx_plugins.torch.counter.pricing import ElementSizes
from rpx_plugins.torch.counter.registry import resolve
from rpx_plugins.torch.counter.repeats import RepeatedBlocks
from rpx_plugins.torch.counter.report import CountReport, summarise


class CountingError(UnsupportedError, RuntimeError):
    """The pass cannot be counted as asked, e.g. a data-dependent op on the meta device; the message says what to do."""


class CountingMode(TorchDispatchMode):
    """Runs every aten op for real and hands it to the ledger; turns meta's data-dependence failures into advice."""

    def __init__(self, ledger: Ledger, on_meta: bool) -> None:
        super().__init__()
        self.ledger = ledger
        self.on_meta = on_meta
        self.remembered = MetaOutputs() if on_meta else None

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        try:
            out = self.remembered.call(func, args, kwargs) if self.remembered else func(*args, **kwargs)
        except (RuntimeError, NotImplementedError) as error:
            if self.on_meta and "meta" in str(error).lower():
                raise meta_error(str(func), error) from error
            raise
        if not self.ledger.paused:
            self.ledger.record(func, args, kwargs, out)
        return out


def meta_error(op: str, error: BaseException) -> CountingError:
    if "expected device" in str(error) or "same device" in str(error):
        why = ("it mixes meta tensors with tensors on a real device (a tensor the model holds outside its parameters "
               "and buffers, or makes on a fixed device)")
    else:
        why = "its result depends on tensor values (.item(), nonzero, boolean masks, unique, ...), and meta tensors have none"
    return CountingError(
        f"cannot count {op} on the meta device: {why}. Count this model on a real device instead (e.g. build it "
        f"and its inputs on 'cpu', with small inputs if memory is short). Underlying error: {error}"
    )


Model = TypeVar("Model", bound=torch.nn.Module)


def build_on_meta(factory: Callable[..., Model], **kwargs: Any) -> Model:
    """Build a module on the meta device: parameters have shapes and dtypes but no storage, so any size fits."""
    with torch.device("meta"), InitsSkippedOnMeta():
        return factory(**kwargs)


class InitsSkippedOnMeta(TorchFunctionMode):
    """``torch.nn.init`` initialisers return meta tensors untouched: they only fill values, which meta tensors do not
    have, and they are half of building a large model on meta (kaiming_uniform_'s fan computations per Linear)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            tensor = args[0] if args else kwargs.get("tensor")
            if isinstance(tensor, torch.Tensor) and tensor.is_meta:
                return tensor
        return func(*args, **kwargs)



def count_model(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
    *,
    backward: bool = False,
    top_k: int | None = 20,
    module_depth: int = 3,
    formulas: Iterable[OpFormula] = (),
    attention_backward: str = "without_recompute",
    element_sizes: Mapping[torch.dtype, int] | None = None,
    replay_repeats: bool = True,
    sequence: bool = False,
) -> CountReport:
    """Run ONE real pass of ``model(*args, **kwargs)`` and count its FLOPs, bytes and activation memory.

    The forward runs in the caller's grad mode (so ``torch.no_grad()`` or ``model.eval()`` decide which kernels run);
    with ``backward=True`` it runs with grad enabled and is followed by a backward pass from the sum of the floating
    outputs that require grad (gradient of ones; parameter ``.grad`` fields are left untouched).

    ``top_k`` bounds ``by_operator`` and ``by_module`` to the largest entries (by FLOPs, then bytes), the rest folded
    into one "(others)" entry so sums stay exact; None lists all. Module paths deeper than ``module_depth`` components
    are folded into their ancestor. Operator records (``op_records``) are never truncated.

    ``formulas`` are plugins' operator formulas (asked before the built-in ones); ``attention_backward`` says how a
    fused attention kernel's backward is counted (see CAUSAL_MASK_CONVENTION); ``element_sizes`` counts tensors of the
    given dtypes at another size per element (fp8/int8 counted with a 2-byte stand-in dtype). ``replay_repeats``: on
    meta without backward, identical layers of a stack are traced twice and replayed after (see
    rpx_plugins.torch.counter.repeats; the figures are the same, ``FlopsResult.replayed`` says which calls were).
    ``sequence``: also list every call in call order (``CountReport.calls``; every layer is then traced, none replayed).

    Raises CountingError when an op cannot run on meta (data-dependent) or backward has nothing to differentiate,
    PluginError when a plugin's formula names no operator.
    """
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1 or None, got {top_k}")
    if module_depth < 1:
        raise ValueError(f"module_depth must be >= 1, got {module_depth}")
    if attention_backward not in ATTENTION_BACKWARD_CONVENTIONS:
        raise ValueError(f"attention_backward must be one of {ATTENTION_BACKWARD_CONVENTIONS}, got {attention_backward!r}")
    kwargs = kwargs or {}
    device = _device_of(model, args, kwargs)
    overrides = ATTENTION_BACKWARD_WITH_RECOMPUTE if attention_backward == "with_recompute" else {}
    ledger = Ledger(model, ElementSizes(element_sizes), resolve(formulas), overrides)
    if sequence:
        ledger.sequence = []
        replay_repeats = False
    on_meta = device == "meta"
    with contextlib.ExitStack() as stack:
        if backward:
            stack.enter_context(torch.enable_grad())
        stack.enter_context(ledger.module_hooks())
        stack.enter_context(CountingMode(ledger, on_meta))
        if on_meta:
            stack.enter_context(CpuAttentionOnMeta(ledger))
        repeats = stack.enter_context(RepeatedBlocks(ledger)) if on_meta and replay_repeats and not backward else None
        outputs = _forward(model, args, kwargs, on_meta)
        ledger.stop_tracking()
        if backward:
            _backward(ledger, model, args, kwargs, outputs)
    return summarise(ledger, args, kwargs, outputs, backward=backward, device=device, top_k=top_k, depth=module_depth,
                     replayed=repeats.lines() if repeats else ())


def _device_of(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """Device type of the first input tensor, else of the first parameter or buffer."""
    for value in (*tensors_within((args, kwargs)), *model.parameters(), *model.buffers()):
        return value.device.type
    return "cpu"


def _forward(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], on_meta: bool) -> Any:
    try:
        return model(*args, **kwargs)
    except CountingError:
        raise
    except (RuntimeError, NotImplementedError) as error:  # e.g. Tensor.tolist() reads data outside aten dispatch
        if on_meta and "meta" in str(error).lower():
            raise meta_error("an operation outside aten dispatch", error) from error
        raise


def _backward(
    ledger: Ledger, model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], outputs: Any
) -> None:
    """Backward from the sum of the outputs that require grad (in any container the model returns), into trainable
    parameters and grad-requiring inputs.

    torch.autograd.grad rather than .backward(): the gradients are computed (and counted) but never stored in the
    user's ``.grad`` fields.
    """
    roots = [t for t in tensors_within(outputs) if t.requires_grad]
    targets = [p for p in model.parameters() if p.requires_grad]
    targets += [t for t in tensors_within((args, kwargs)) if t.requires_grad]
    if not roots or not targets:
        raise CountingError(
            "backward=True, but nothing to differentiate: no model output requires grad, or no parameter/input does "
            "(are all parameters frozen?)"
        )
    with ledger.pause():
        seeds = [torch.ones_like(root) for root in roots]
    ledger.start_backward()
    torch.autograd.grad(roots, targets, seeds, allow_unused=True)
