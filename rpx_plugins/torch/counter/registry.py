"""Where FLOP formulas are registered and found: built-in ones keyed by aten operator objects, and plugins' ones.

A built-in formula is registered where it is defined, with ``@formula(aten.mm, aten.bmm)``: the key is the operator
object itself, so a misspelled operator fails when rpx imports the counter, and a second formula for the same
operator is refused (:class:`DuplicateFormulaError`), as torch's ``register_flop_formula`` does. Plugins add or
override formulas through the ``rpx_register_op_formulas`` hook (:class:`rpx_core.registry.op_formula.OpFormula`); theirs are
resolved when counting starts and asked first.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import torch
from torch._ops import OpOverload, OpOverloadPacket

from rpx_core.plugin import OpFormula, PluginError

aten = torch.ops.aten


class OpCall:
    """One operator call as a formula sees it: ``args`` by schema name (defaults filled) and the ``outputs`` tensors."""

    __slots__ = ("args", "outputs")

    def __init__(self, args: dict[str, Any], outputs: list[torch.Tensor]) -> None:
        self.args = args
        self.outputs = outputs

    def first(self) -> torch.Tensor:
        """The first argument: the tensor an elementwise, norm or reduction op works on."""
        return next(iter(self.args.values()))

    def out_numel(self) -> int:
        return self.outputs[0].numel()


#: A FLOP formula: (MACs, other FLOPs) of one call, or None when this variant of the op has no formula.
Formula = Callable[[OpCall], "tuple[int, int] | None"]
#: The built-in formulas, by operator (overload packet: every overload of ``aten.add`` shares one formula).
BUILTIN: dict[OpOverloadPacket, Formula] = {}


class DuplicateFormulaError(ValueError):
    """A second built-in formula for an operator that has one: one of them is a mistake."""


def formula(*ops: OpOverloadPacket) -> Callable[[Formula], Formula]:
    """Register the decorated function as the built-in FLOP formula of each of ``ops``."""

    def register(function: Formula) -> Formula:
        for op in ops:
            if not isinstance(op, OpOverloadPacket):
                raise TypeError(f"@formula takes operators such as aten.mm, got {op!r}")
            if op in BUILTIN:
                raise DuplicateFormulaError(
                    f"{op} already has a formula ({BUILTIN[op].__qualname__}); cannot register "
                    f"{function.__qualname__} for it too"
                )
            BUILTIN[op] = function
        return function

    return register


#: Names given to ``present`` that this torch lacks: empty on the pinned torch (a test checks it, so a typo fails).
ABSENT: list[str] = []


def present(*names: str) -> tuple[OpOverloadPacket, ...]:
    """The aten operators among ``names`` that this torch has: for operators newer than the oldest torch rpx supports
    and for the names of the shared cost table; the others are listed in ABSENT."""
    ABSENT.extend(name for name in names if not hasattr(aten, name))
    return tuple(getattr(aten, name) for name in names if hasattr(aten, name))


# -- plugins' formulas -------------------------------------------------------------------------------------------------


class PluginFormula(NamedTuple):
    """A plugin's OpFormula as the counter uses it: a Formula for (MACs, other FLOPs), an optional bytes formula."""

    flops: Formula
    bytes: Callable[[OpCall], tuple[int, int]] | None
    plugin: str


_OP_NAME = re.compile(r"^(?P<namespace>\w+)::(?P<name>\w+)(?:\.(?P<overload>\w+))?$")


def resolve(formulas: Iterable[OpFormula]) -> dict[OpOverload | OpOverloadPacket, PluginFormula]:
    """Plugins' formulas by operator object, the first in plugin order winning for an operator two plugins price;
    an operator that does not resolve, or one plugin pricing one operator twice, is one PluginError naming it."""
    resolved: dict[OpOverload | OpOverloadPacket, PluginFormula] = {}
    for entry in formulas:
        op = _operator(entry)
        if op in resolved:
            if resolved[op].plugin == entry.plugin:
                raise PluginError(f"plugin {entry.plugin!r}: two op formulas for {op}")
            continue
        resolved[op] = PluginFormula(_as_formula(entry), entry.bytes, entry.plugin or "<unnamed>")
    return resolved


def _operator(entry: OpFormula) -> OpOverload | OpOverloadPacket:
    op = getattr(entry.op, "_opoverload", entry.op)  # a torch.library.custom_op function stands for its operator
    if isinstance(op, (OpOverload, OpOverloadPacket)):
        return op
    where = f"plugin {entry.plugin!r}: op formula for {op!r}"
    if entry.library:
        try:
            importlib.import_module(entry.library)
        except ImportError as error:
            raise PluginError(f"{where}: cannot import its library {entry.library!r}: {error}") from None
    if not isinstance(op, str):
        raise PluginError(f"{where}: not a torch operator; give torch.ops.<namespace>.<name> or 'namespace::name'")
    match = _OP_NAME.match(op)
    if match is None:
        raise PluginError(f"{where}: write an operator name as 'namespace::name' or 'namespace::name.overload'")
    namespace, name, overload = match.group("namespace", "name", "overload")
    try:
        packet = getattr(getattr(torch.ops, namespace), name)
        return getattr(packet, overload) if overload else packet
    except (AttributeError, RuntimeError):
        raise PluginError(
            f"{where}: torch has no such operator (is the library that defines it imported before counting?)"
        ) from None


def _as_formula(entry: OpFormula) -> Formula:
    macs, other = entry.macs, entry.flops

    def flops(call: OpCall) -> tuple[int, int]:
        return (int(macs(call)) if macs else 0), (int(other(call)) if other else 0)

    return flops


def lookup(
    func: OpOverload, plugins: dict[OpOverload | OpOverloadPacket, PluginFormula]
) -> tuple[Formula | None, PluginFormula | None]:
    """The formula for ``func``: a plugin's for the overload, the operator or its out-of-place operator (``add_`` ->
    ``add``), else the built-in one for the operator or its out-of-place operator; (built-in, plugin's) by kind."""
    packet = func._overloadpacket
    base = _out_of_place(packet)
    for key in (func, packet, base):
        if key is not None and key in plugins:
            return plugins[key].flops, plugins[key]
    return BUILTIN.get(packet) or (BUILTIN.get(base) if base is not None else None), None


def _out_of_place(packet: OpOverloadPacket) -> OpOverloadPacket | None:
    name = packet.__name__
    if not name.endswith("_") or name.endswith("__"):
        return None
    namespace = packet._qualified_op_name.split("::")[0]
    return getattr(getattr(torch.ops, namespace), name[:-1], None)
