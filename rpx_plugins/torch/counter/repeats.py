"""Repeated blocks: trace one layer of a stack, replay its count for the identical layers after it.

Why: an 80-layer decoder dispatches the same few hundred operators 80 times; on meta, where nothing depends on
tensor values, a layer's operators, shapes, bytes and activation memory are fixed by its structure and its inputs'
shapes. So a shape sweep of a 70B-parameter model need not trace every layer of every shape.

When it is exact, and what happens otherwise: a child of an ``nn.ModuleList``/``nn.Sequential`` is a candidate when
a sibling has the same *structure* (module types, every plain attribute's value, parameter and buffer shapes, strides,
dtypes and sharing, no hooks of the user's). A call is *keyed* by that structure and by its inputs (shapes, strides,
dtypes, aliasing; non-tensor arguments only of immutable kinds, so no cache object a layer would update). The first
two calls with a key are traced in full and their effects on the ledger compared, relative to the module's path:
FLOPs and bytes per operator and submodule, submodule calls, weight views read (by parameter name), the activation
peak above the live bytes at entry, and what stays alive after (exactly the outputs, none aliasing an input or a
weight). Only when both traces agree are the later calls with the key replayed: the same effects charged to the
caller's own paths and weights, and fresh meta tensors of the recorded shapes and strides returned as its outputs.
Anything else (a real device, grad enabled, a paused or backward pass, a differing trace, an output that is not a
tensor, None, a plain value, or a tuple/list/dict of them) runs for real.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Iterator
from typing import Any

import attrs
import torch

from rpx_plugins.torch.counter.containers import tensors_within
from rpx_plugins.torch.counter.ledger import FORWARD, Ledger
from rpx_plugins.torch.counter.pricing import storage_key

#: Arguments and attributes compared by value; anything else makes a call run for real (an argument) or is compared
#: by identity (an attribute: the same shared object for every layer, like a configuration).
PLAIN = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size, torch.memory_format,
         torch.layout)
#: nn.Module's own bookkeeping attributes: compared through parameters, buffers, submodules and hooks instead.
MODULE_INTERNALS = frozenset(vars(torch.nn.Module())) - {"training"}
#: A layer's index in its stack (Hugging Face's ``layer_idx``, Megatron's ``layer_number``): it differs between
#: otherwise identical layers by construction, so it is left out of the structure; what it changes is seen by the
#: two traces (layers 0 and 1 have different indices), and a layer that keeps a cache by it gets a cache argument.
POSITION_ATTRIBUTES = frozenset({"layer_idx", "layer_id", "layer_index", "layer_number"})
HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential)


class Unkeyable(Exception):
    """This call cannot be keyed (an argument of a kind that might carry state): it runs for real."""


@attrs.frozen
class Effect:
    """What one traced call did to the ledger, relative to the module's own path and weights."""

    #: Paths are relative to the module ("" is the module itself), or ("", absolute path) outside it.
    tally: dict[tuple[Any, Any, str], int]  # (price key, path, phase) -> calls
    calls: dict[Any, int]  # path -> module calls
    weight_reads: dict[tuple[Any, int, Any], int]  # (weight's name in the module, or ("", storage), offset, view) -> bytes
    peak: int  # activation peak above the live bytes at entry
    peak_fp16: int
    outputs: Any  # the output's structure, tensors as TensorShape


@attrs.frozen
class TensorShape:
    """A replayed output: fresh storage of ``storage_bytes``, viewed at ``offset`` with this size and stride."""

    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype
    storage_bytes: int


class RepeatedBlocks:
    """On meta, wraps each candidate layer's forward to trace, compare, and replay as the module docstring says."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.wrapped: list[tuple[torch.nn.Module, Any]] = []
        self.structures: dict[int, int] = {}  # module -> the number of its structure among the candidates'
        self.names: dict[int, dict[int, str]] = {}  # module -> its weights' storages -> their names in it
        self.seen: dict[Any, Effect | None] = {}  # key -> the first trace's effect; None: traces differ, never replay
        self.verified: set[Any] = set()  # keys traced twice with the same effect: replayed from now on
        self.traced: dict[Any, list[str]] = {}  # key -> the paths traced in full
        self.replayed: dict[Any, list[str]] = {}  # key -> the paths replayed

    def __enter__(self) -> RepeatedBlocks:
        modules = [module for module in candidates(self.ledger.model) if not _foreign_hooks(module)]
        shapes = [structure(module) for module in modules]
        number: dict[Any, int] = {}
        for module, shape in zip(modules, shapes):
            self.structures[id(module)] = number.setdefault(shape, len(number))
        repeated = collections.Counter(self.structures.values())
        for module in modules:
            if repeated[self.structures[id(module)]] > 1:
                self.names[id(module)] = {storage_key(t): name for name, t in _weights(module)}
                previous = vars(module).get("forward")
                module.forward = functools.partial(self._call, module, previous or functools.partial(
                    type(module).forward, module))
                self.wrapped.append((module, previous))
        return self

    def __exit__(self, *exc_info: object) -> None:
        for module, previous in self.wrapped:
            if previous is None:
                del module.forward
            else:
                module.forward = previous

    def lines(self) -> tuple[str, ...]:
        """One line per group of replayed calls, naming the calls traced in full that they copy."""
        return tuple(f"{_span(copies)}: {len(copies)} call(s) counted as {' and '.join(self.traced[key])}, which "
                     "have the same structure and input shapes and were traced in full with identical counts"
                     for key, copies in self.replayed.items())

    # -- one call --

    def _call(self, module: torch.nn.Module, forward: Any, *args: Any, **kwargs: Any) -> Any:
        ledger = self.ledger
        if ledger.paused or not ledger.tracking or ledger.where[1] != FORWARD or torch.is_grad_enabled() \
                or not ledger.stack or ledger.stack[-1][0] is not module:
            return forward(*args, **kwargs)
        try:
            key = (self.structures[id(module)], self._inputs_key(args, kwargs))
            hash(key)
        except (Unkeyable, TypeError):
            return forward(*args, **kwargs)
        path = ledger.stack[-1][1]
        effect = self.seen.get(key)
        if key in self.verified and effect is not None:
            self.replayed.setdefault(key, []).append(path)
            return self._replay(module, path, effect)
        if key in self.seen and effect is None:
            return forward(*args, **kwargs)
        output, traced = self._trace(module, path, forward, args, kwargs)
        if traced is None or (key in self.seen and effect != traced):
            self.seen[key] = None
        else:
            if key in self.seen:
                self.verified.add(key)  # a second trace agreed: replay from now on
            self.seen[key] = traced
            self.traced.setdefault(key, []).append(path)
        return output

    def _inputs_key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        storages: list[int | None] = []
        described = (_describe(args, storages), tuple(sorted((k, _describe(v, storages)) for k, v in kwargs.items())))
        if any(key is None or key in self.ledger.weight_bytes for key in storages):
            raise Unkeyable("a weight (or a tensor without storage) passed in")
        return described, tuple(storages.index(key) for key in storages)

    def _trace(self, module: torch.nn.Module, path: str, forward: Any, args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> tuple[Any, Effect | None]:
        ledger = self.ledger
        entry_storages = set(map(storage_key, tensors_within((args, kwargs))))
        with ledger.captured() as capture:
            output = forward(*args, **kwargs)
        try:
            outputs, output_bytes, output_fp16 = self._output_shapes(output, entry_storages)
        except Unkeyable:
            return output, None
        if (ledger.live_bytes - capture.live_at_entry, ledger.live_bytes_fp16 - capture.live_fp16_at_entry) \
                != (output_bytes, output_fp16):
            return output, None  # something else stayed alive (state kept by the layer): not a pure function
        names = self.names[id(module)]
        prefix = path + "."

        def relative(where: str) -> Any:
            return where.removeprefix(prefix) if where.startswith(prefix) else ("", where) if where != path else ""

        tally = {(price_key, relative(where), phase): count for (price_key, (where, phase)), count in capture.tally.items()}
        calls = {relative(where): count for where, count in capture.calls.items()}
        reads = {(names.get(storage, ("", storage)), offset, view): nbytes
                 for (storage, offset, view), nbytes in capture.weight_views.items()}
        return output, Effect(tally, calls, reads, capture.peak - capture.live_at_entry,
                              capture.peak_fp16 - capture.live_fp16_at_entry, outputs)

    def _output_shapes(self, output: Any, entry_storages: set[Any]) -> tuple[Any, int, int]:
        """The output's structure for replay, and the live bytes its storages hold (each once)."""
        counted: dict[int, tuple[int, int]] = {}

        def shape(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                key = storage_key(value)
                entry = self.ledger.live.get(key) if key is not None else None
                if key in entry_storages or entry is None or value.requires_grad or key in counted:
                    raise Unkeyable("an output that is an input, a weight, untracked or shares storage")
                counted[key] = entry[1], entry[2]
                return TensorShape(tuple(value.shape), value.stride(), value.storage_offset(), value.dtype,
                                   value.untyped_storage().nbytes())
            return _rebuild(value, shape)

        outputs = shape(output)
        return outputs, sum(v[0] for v in counted.values()), sum(v[1] for v in counted.values())

    def _replay(self, module: torch.nn.Module, path: str, effect: Effect) -> Any:
        ledger = self.ledger
        weights = dict(_weights(module))

        def absolute(where: Any) -> str:
            if isinstance(where, tuple):
                return where[1]
            return f"{path}.{where}" if where else path

        for (price_key, where, phase), count in effect.tally.items():
            slot = (price_key, (absolute(where), phase))
            ledger.tally[slot] = ledger.tally.get(slot, 0) + count
        for where, count in effect.calls.items():
            ledger.module_calls[absolute(where)] += count
        for (name, offset, view), nbytes in effect.weight_reads.items():
            storage = name[1] if isinstance(name, tuple) else storage_key(weights[name])
            ledger.read_weight((storage, offset, view), nbytes)
        ledger.peak_bytes = max(ledger.peak_bytes, ledger.live_bytes + effect.peak)
        ledger.peak_bytes_fp16 = max(ledger.peak_bytes_fp16, ledger.live_bytes_fp16 + effect.peak_fp16)

        def make(value: Any) -> Any:
            if isinstance(value, TensorShape):
                with ledger.pause():
                    storage = torch.UntypedStorage(value.storage_bytes, device="meta")
                    tensor = torch.empty(0, dtype=value.dtype, device="meta").set_(storage, value.offset, value.size,
                                                                                   value.stride)
                ledger.adopt(tensor)
                return tensor
            return _rebuild(value, make)

        return make(effect.outputs)


def candidates(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Children of ModuleLists and Sequentials, outermost only (a layer inside a replayed layer is replayed with it)."""
    inside: set[int] = set()
    for module in model.modules():
        if id(module) in inside or not isinstance(module, CONTAINERS):
            continue
        for child in module.children():
            if id(child) not in inside:
                inside.update(id(m) for m in child.modules())
                yield child


def structure(module: torch.nn.Module) -> Any:
    """Everything a module's forward can depend on when tensors have no values, comparable across siblings."""
    position = {}
    weights = []
    for name, tensor in _weights(module):
        key = storage_key(tensor)
        weights.append((name, tuple(tensor.shape), tensor.stride(), tensor.storage_offset(), tensor.dtype,
                        tensor.requires_grad, position.setdefault(key, len(position))))
    parts = []
    for name, sub in module.named_modules(remove_duplicate=False):
        hooks = tuple(tuple(getattr(sub, hooks).values()) for hooks in HOOK_DICTS)  # rpx's own (see _foreign_hooks)
        attributes = tuple(sorted((k, _attribute(v, sub)) for k, v in vars(sub).items()
                                  if k not in MODULE_INTERNALS and not (k in POSITION_ATTRIBUTES and type(v) is int)))
        parts.append((name, type(sub), attributes, hooks))
    return tuple(parts), tuple(weights)


def _foreign_hooks(module: torch.nn.Module) -> bool:
    """Hooks other than rpx's own counting helpers' (a user's hook may keep state per call: never skip it)."""
    return any(not type(getattr(hook, "__self__", None)).__module__.startswith("rpx_plugins.torch.counter")
               for sub in module.modules() for hooks in HOOK_DICTS for hook in getattr(sub, hooks).values())


def _weights(module: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]


def _attribute(value: Any, owner: torch.nn.Module) -> Any:
    if isinstance(value, PLAIN):
        return value
    if isinstance(value, (tuple, list, frozenset)):
        return type(value), tuple(_attribute(v, owner) for v in value)
    if isinstance(value, dict):
        return dict, tuple((k, _attribute(v, owner)) for k, v in value.items())
    if isinstance(value, torch.Tensor):  # a plain tensor attribute: its shape (meta has no values)
        return torch.Tensor, tuple(value.shape), value.stride(), value.dtype
    if isinstance(value, functools.partial) and value.args and value.args[0] is owner:
        return functools.partial, value.func, _attribute(value.args[1:], owner), _attribute(value.keywords, owner)
    return id(value)  # the same shared object (a configuration, a function) for every sibling


def _describe(value: Any, storages: list[int | None]) -> Any:
    if isinstance(value, torch.Tensor):
        if value.requires_grad:
            raise Unkeyable("an input that requires grad")
        storages.append(storage_key(value))
        return tuple(value.shape), value.stride(), value.storage_offset(), value.dtype, value.device
    if isinstance(value, PLAIN):
        return value
    if type(value) in (tuple, list):
        return type(value), tuple(_describe(v, storages) for v in value)
    if type(value) is dict:
        return dict, tuple((k, _describe(v, storages)) for k, v in value.items())
    raise Unkeyable(f"an argument of type {type(value).__name__}")


def _rebuild(value: Any, each: Any) -> Any:
    """``value`` with ``each`` applied to its leaves: plain values kept, tuples/lists/dicts rebuilt; else Unkeyable."""
    if isinstance(value, PLAIN):
        return value
    if type(value) in (tuple, list):
        return type(value)(each(v) for v in value)
    if type(value) is dict:
        return {k: each(v) for k, v in value.items()}
    raise Unkeyable(f"an output of type {type(value).__name__}")


def _span(paths: list[str]) -> str:
    return paths[0] if len(paths) == 1 else f"{paths[0]} .. {paths[-1]}"

