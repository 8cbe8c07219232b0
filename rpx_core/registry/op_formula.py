"""A plugin's price for one operator: what ``rpx_register_op_formulas`` returns.

Modelled on torch's ``register_flop_formula`` (a formula per operator object, computed from the call) and fvcore's
``set_op_handle`` (operators named by string, handles added or replaced by the user). Torch-free, so registering a
formula imports nothing heavy: an operator may be named as a string (with the module that defines it) and is resolved
when counting starts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

_optional_callable = attrs.validators.optional(attrs.validators.is_callable())


def _op_given(_instance: Any, _attribute: Any, value: Any) -> None:
    if value is None or value == "":
        raise ValueError("OpFormula needs an operator: an op object (torch.ops.mylib.fused_gelu) or 'mylib::fused_gelu'")


@attrs.frozen
class OpFormula:
    """FLOPs (and optionally bytes) of ONE call of ``op``, each computed by a function of the call.

    Each function receives the call (``call.args``: the arguments by schema name, defaults filled; ``call.outputs``:
    the output tensors; ``call.first()``: the first argument; ``call.out_numel()``: the first output's elements) and
    returns an int. Conventions are rpx's: ``macs`` are matrix multiply-accumulates (reported as 2 x macs matrix
    FLOPs), ``flops`` every other FLOP (elementwise, reductions; price them from :mod:`rpx_core.cost_table` to stay
    comparable); a missing one is 0. ``bytes`` returns (bytes read, bytes written) of the call; without it rpx
    measures them from the tensors (every input read, every output written). A plugin formula is asked before the
    built-in one, for the overload named, for every overload of a packet, and for in-place variants (``op_``).
    """

    #: The operator: torch.ops.<namespace>.<name> (every overload) or .<overload>, a torch.library.custom_op function,
    #: or its name as a string, "namespace::name" or "namespace::name.overload"
    op: Any = attrs.field(validator=_op_given)
    macs: Callable[[Any], int] | None = attrs.field(default=None, validator=_optional_callable)
    flops: Callable[[Any], int] | None = attrs.field(default=None, validator=_optional_callable)
    bytes: Callable[[Any], tuple[int, int]] | None = attrs.field(default=None, validator=_optional_callable)
    #: The module that defines ``op`` (with torch.library), imported when counting starts, before ``op`` is resolved:
    #: the hook itself then imports nothing heavy (it is called when plugins load, e.g. by ``rpx plugins``).
    library: str | None = None
    plugin: str | None = None  # set by rpx: the plugin that registered it

    def __attrs_post_init__(self) -> None:
        if self.macs is None and self.flops is None:
            raise ValueError(f"OpFormula for {self.op!r} gives neither macs nor flops")
