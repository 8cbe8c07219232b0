"""The ledger: one counted pass's bookkeeping (calls per price, module and phase; the module stack; live storages)."""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import torch

from rpx_core.types.counts import BACKWARD_MODULE
from rpx_plugins.torch.counter.operators import FREE_KINDS, OpInfo, classify
from rpx_plugins.torch.counter.pricing import (
    ElementSizes,
    Price,
    describe,
    inputs_text,
    price_call,
    storage_key,
    tensors_in,
)
from rpx_plugins.torch.counter.registry import Formula, PluginFormula

FORWARD, BACKWARD = "forward", "backward"
#: The first element of a sequence entry of a call that costs nothing (Ledger.sequence).
FREE = "free"


class Ledger:
    """Counts calls per (price, module, phase), tracks the module stack and live activation storages."""

    def __init__(
        self,
        model: torch.nn.Module,
        sizes: ElementSizes,
        plugins: dict[Any, PluginFormula],
        overrides: dict[Any, Formula],
    ) -> None:
        self.model = model
        self.sizes = sizes
        self.plugins = plugins  # plugins' formulas, by operator
        self.overrides = overrides  # built-in formulas replaced by an option's variant, by operator
        self.weight_bytes = {
            key: sizes.storage_bytes(tensor)
            for tensor in (*model.parameters(), *model.buffers())
            if (key := storage_key(tensor)) is not None
        }
        self.module_names = self._qualified_names(model)
        self.infos: dict[Any, OpInfo] = {}
        self.prices: dict[Any, Price] = {}
        self.tally: dict[tuple[Any, tuple[str, str]], int] = {}
        self.module_calls: dict[str, int] = defaultdict(int)
        self.stack: list[tuple[torch.nn.Module, str]] = []
        self.where: tuple[str, str] = ("", FORWARD)  # (module path, phase) charged for the next op
        self.weight_views: dict[tuple[Any, ...], int] = {}  # (storage, offset, view) -> most bytes read through it
        self.paused = False
        #: Every call in call order, when asked for (count_model(sequence=True)): its slot (price key, where), or
        #: (FREE, (label, inputs), where) for a view or metadata query, which costs nothing.
        self.sequence: list[tuple[Any, ...]] | None = None
        # activation liveness (forward pass only)
        self.tracking = True
        self.live: dict[int, tuple[weakref.ref, int, int]] = {}  # storage key -> (weakref, bytes, fp16 bytes)
        self.live_bytes = self.live_bytes_fp16 = 0
        self.peak_bytes = self.peak_bytes_fp16 = 0

    @staticmethod
    def _qualified_names(model: torch.nn.Module) -> dict[int, tuple[str, ...]]:
        names: dict[int, list[str]] = defaultdict(list)
        for name, module in model.named_modules(remove_duplicate=False):
            names[id(module)].append(name)
        return {key: tuple(value) for key, value in names.items()}

    # -- module stack --

    def enter_module(self, module: torch.nn.Module, _args: Any) -> None:
        names = self.module_names.get(id(module))
        if names is None:  # a module outside the counted model
            return
        parent = self.stack[-1][1] if self.stack else None
        path = self._path_under(names, parent)
        self.stack.append((module, path))
        if self.where[1] == FORWARD:
            self.module_calls[path] += 1
            self.where = (path, FORWARD)

    def exit_module(self, module: torch.nn.Module, _args: Any, _output: Any) -> None:
        if self.stack and self.stack[-1][0] is module:
            self.stack.pop()
            if self.where[1] == FORWARD:
                self.where = (self.stack[-1][1] if self.stack else "", FORWARD)

    @staticmethod
    def _path_under(names: tuple[str, ...], parent: str | None) -> str:
        """A shared module's name under the module calling it (``a.shared`` vs ``b.shared``), else its first name."""
        if parent:
            prefix = parent + "."
            for name in names:
                if name.startswith(prefix):
                    return name
        return names[0]

    @contextlib.contextmanager
    def module_hooks(self) -> Iterator[None]:
        pre = torch.nn.modules.module.register_module_forward_pre_hook(self.enter_module)
        post = torch.nn.modules.module.register_module_forward_hook(self.exit_module, always_call=True)
        try:
            yield
        finally:
            pre.remove()
            post.remove()

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """Run rpx's own helper ops without counting them."""
        self.paused = True
        try:
            yield
        finally:
            self.paused = False

    def start_backward(self) -> None:
        self.where = (BACKWARD_MODULE, BACKWARD)

    # -- the hot path: one call --

    def record(self, func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        info = self.infos.get(func)
        if info is None:
            info = self.infos[func] = classify(func, self.plugins, self.overrides)
        if info.kind in FREE_KINDS:
            if self.sequence is not None:
                self.sequence.append((FREE, (info.label, inputs_text(args, kwargs)), self.where))
            return
        tensors: list[torch.Tensor] = []
        signature = [describe(value, tensors) for value in args]
        if kwargs:
            signature += [(name, describe(value, tensors)) for name, value in kwargs.items()]
        if len(tensors) > 1:  # the same tensor passed twice is read once: the price depends on which repeat
            ids = [id(tensor) for tensor in tensors]
            if len(set(ids)) < len(ids):
                signature.append(tuple(ids.index(i) for i in ids))
        if info.dynamic_output:  # the inputs do not determine the output sizes, so the price also keys on them
            signature.append(describe(out, []))
        keys = [storage_key(tensor) for tensor in tensors]
        weights = self.weight_bytes
        is_weight = tuple([key in weights for key in keys])
        price_key: Any = (func, tuple(signature), is_weight)
        try:
            price = self.prices[price_key]
        except KeyError:
            price = self.prices[price_key] = price_call(info, args, kwargs, out, tensors, is_weight, self.sizes)
        except TypeError:  # an unhashable argument: key on its text instead
            price_key = repr(price_key)
            price = self.prices.get(price_key)
            if price is None:
                price = self.prices[price_key] = price_call(info, args, kwargs, out, tensors, is_weight, self.sizes)
        slot = (price_key, self.where)
        self.tally[slot] = self.tally.get(slot, 0) + 1
        if self.sequence is not None:
            self.sequence.append(slot)
        for read in price.weight_reads:
            offset = -1 if read.view is None else tensors[read.index].storage_offset()
            self.read_weight((keys[read.index], offset, read.view), read.nbytes)
        if self.tracking:
            self._track_outputs(out, keys, price.outputs)

    def _track_outputs(self, out: Any, input_keys: list[int | None], results: int | None) -> None:
        """Start tracking every storage this call allocated (not an input's, not a weight's, not already tracked)."""
        for tensor in list(tensors_in(out))[:results]:
            key = storage_key(tensor)
            if key is None or key in self.live or key in input_keys or key in self.weight_bytes:
                continue
            self.adopt(tensor, key)

    def adopt(self, tensor: torch.Tensor, key: int | None = None) -> None:
        """Track ``tensor``'s storage as a live activation from now until its last reference dies."""
        key = storage_key(tensor) if key is None else key
        storage = tensor.untyped_storage()
        nbytes = stored = storage.nbytes()
        if self.sizes.overrides:  # fp8/int8 counted with a stand-in dtype
            nbytes = self.sizes.storage_bytes(tensor, storage)
        fp16 = stored // tensor.element_size() * 2 if tensor.is_floating_point() else nbytes
        self.live[key] = (weakref.ref(storage, functools.partial(self._release, key)), nbytes, fp16)
        self.live_bytes += nbytes
        self.live_bytes_fp16 += fp16
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        self.peak_bytes_fp16 = max(self.peak_bytes_fp16, self.live_bytes_fp16)

    def read_weight(self, view: tuple[Any, ...], nbytes: int) -> None:
        """A weight view (storage, offset, view) read ``nbytes``: the fused count keeps the most bytes per view."""
        if nbytes > self.weight_views.get(view, 0):
            self.weight_views[view] = nbytes

    @contextlib.contextmanager
    def captured(self) -> Iterator[Capture]:
        """What the ledger records inside the block, apart (for rpx_plugins.torch.counter.repeats), and also as usual:
        calls, module calls, weight views, and the activation peak reached inside it."""
        saved = self.tally, self.module_calls, self.weight_views, self.peak_bytes, self.peak_bytes_fp16
        capture = Capture(self.live_bytes, self.live_bytes_fp16)
        self.tally, self.module_calls, self.weight_views = capture.tally, capture.calls, capture.weight_views
        self.peak_bytes, self.peak_bytes_fp16 = self.live_bytes, self.live_bytes_fp16
        try:
            yield capture
        finally:
            capture.peak, capture.peak_fp16 = self.peak_bytes, self.peak_bytes_fp16
            self.tally, self.module_calls, self.weight_views = saved[:3]
            self.peak_bytes, self.peak_bytes_fp16 = max(saved[3], capture.peak), max(saved[4], capture.peak_fp16)
            for slot, count in capture.tally.items():
                self.tally[slot] = self.tally.get(slot, 0) + count
            for path, count in capture.calls.items():
                self.module_calls[path] += count
            for view, nbytes in capture.weight_views.items():
                self.read_weight(view, nbytes)

    def _release(self, key: int, _ref: weakref.ref) -> None:
        entry = self.live.pop(key, None)
        if entry is not None:
            self.live_bytes -= entry[1]
            self.live_bytes_fp16 -= entry[2]

    def stop_tracking(self) -> None:
        """End of the forward pass: the peak is final; drop the weak references (their callbacks die with them)."""
        self.tracking = False
        self.live.clear()



class Capture:
    """One captured block's records (see Ledger.captured); the peaks are set when the block ends."""

    def __init__(self, live_at_entry: int, live_fp16_at_entry: int) -> None:
        self.live_at_entry, self.live_fp16_at_entry = live_at_entry, live_fp16_at_entry
        self.tally: dict[tuple[Any, tuple[str, str]], int] = {}
        self.calls: dict[str, int] = defaultdict(int)
        self.weight_views: dict[tuple[Any, ...], int] = {}
        self.peak = self.peak_fp16 = 0
