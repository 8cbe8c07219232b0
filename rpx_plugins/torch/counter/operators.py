"""Which kind of work each aten operator does, and what rpx derives once from its schema.

Operators that are zero-FLOP by definition are grouped by what they do to memory (views move nothing, fills only
write, gathers read the rows they return); the rest are priced by a formula (:mod:`.formulas`, or a plugin's) or
listed as uncounted. The groups hold operator objects, so a misspelled one fails at import.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from rpx_plugins.torch.counter import formulas  # noqa: F401  (registers the built-in formulas)
from rpx_plugins.torch.counter.registry import Formula, PluginFormula, aten, lookup, present

#: Views the schema does not declare: _unsafe_view is a view, detach_ only changes autograd metadata, as_strided_
#: only a tensor's sizes and strides (autograd restriding a gradient to its parameter's layout).
ALIASES = frozenset({aten._unsafe_view, aten.detach_, aten.as_strided_})
#: Shape/stride/device queries: no FLOPs, no bytes.
METADATA = frozenset(
    {
        aten.size, aten.sym_size, aten.stride, aten.sym_stride, aten.numel, aten.sym_numel, aten.dim,
        aten.storage_offset, aten.sym_storage_offset, aten.is_contiguous, aten.is_strides_like_format,
        aten.is_non_overlapping_and_dense, aten.is_same_size, aten.result_type, *present("sym_is_contiguous", "device"),
    }
)
#: Allocations that leave memory uninitialised: no FLOPs, no bytes.
EMPTY_ALLOCATIONS = frozenset(
    {aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty, aten.new_empty_strided, aten.empty_permuted,
     aten.resize_}
)
#: Creation ops that fill their output (constants, ranges, random numbers): no FLOPs, no reads, output written.
FILLS = frozenset(
    {
        aten.zeros, aten.zeros_like, aten.new_zeros, aten.ones, aten.ones_like, aten.new_ones, aten.full,
        aten.full_like, aten.new_full, aten.fill, aten.fill_, aten.zero_, aten.scalar_tensor, aten.arange,
        aten.linspace, aten.logspace, aten.eye, aten.rand, aten.rand_like, aten.randn, aten.randn_like, aten.randint,
        aten.randint_like, aten.randperm, aten.normal, aten.normal_, aten.uniform_, aten.bernoulli, aten.bernoulli_,
        aten.exponential_, aten.random_,
    }
)
#: Gathers: no FLOPs; read only the rows they return (plus indices), not the whole table.
GATHERS = frozenset({aten.embedding, aten.index_select, aten.gather, aten.index, aten._unsafe_index})
#: Pure data movement (copies, concatenation, padding, masking by selection): no FLOPs, bytes counted.
DATA_MOVEMENT = frozenset(
    {
        aten.clone, aten._to_copy, aten.copy, aten.copy_, aten._copy_from, aten._copy_from_and_resize, aten.cat,
        aten.stack, aten.scatter, aten.slice_scatter, aten.select_scatter, aten.diagonal_scatter,
        aten.as_strided_scatter, aten.masked_scatter, aten.constant_pad_nd, aten.reflection_pad1d,
        aten.reflection_pad2d, aten.reflection_pad3d, aten.replication_pad1d, aten.replication_pad2d,
        aten.replication_pad3d, aten.repeat, aten.flip, aten.roll, aten.tril, aten.triu, aten.narrow_copy,
        aten.upsample_nearest1d, aten.upsample_nearest2d, aten.upsample_nearest3d, aten._upsample_nearest_exact1d,
        aten._upsample_nearest_exact2d, aten._upsample_nearest_exact3d, aten.pixel_shuffle, aten.pixel_unshuffle,
        aten.channel_shuffle, aten.im2col, aten._local_scalar_dense, aten.lift_fresh_copy, aten.view_copy,
        aten.permute_copy, aten.transpose_copy, aten.t_copy, aten.expand_copy, aten.slice_copy, aten.select_copy,
        aten.unsqueeze_copy, aten.squeeze_copy, aten._reshape_copy, aten.alias_copy, aten.detach_copy,
        aten.split_copy, aten.split_with_sizes_copy, aten.unbind_copy, aten.diagonal_copy, aten.as_strided_copy,
        aten.unfold_copy, aten.slice_backward, aten.select_backward, aten.diagonal_backward,
    }
)
#: Ops whose mutated destination is only written, never read.
WRITE_ONLY_DESTINATION = frozenset({aten.copy_, aten._copy_from, aten._copy_from_and_resize})
#: Batch norm in inference returns placeholder statistics (see ``result_count``).
BATCH_NORMS = frozenset(
    {aten.native_batch_norm, aten._native_batch_norm_legit, aten._native_batch_norm_legit_no_training,
     aten.cudnn_batch_norm, aten.miopen_batch_norm}
)

#: Kinds of operators, by how their cost is found.
VIEW, METADATA_QUERY, ALLOCATION, FILL, GATHER, MOVEMENT, FORMULA, UNKNOWN = range(8)
FREE_KINDS = (VIEW, METADATA_QUERY)


class OpInfo(NamedTuple):
    """What rpx knows about one aten overload, derived once from its name and schema."""

    label: str  # "aten.mm"
    kind: int  # one of the kinds above
    formula: Formula | None
    plugin: PluginFormula | None  # the plugin's formula pricing this op, if one does
    arg_names: tuple[str, ...]  # schema argument names, in order
    defaults: dict[str, Any]  # schema defaults, so formulas read every argument by name
    write_only: frozenset[str]  # arguments only written (out=, copy_ destination): not read
    unreturned_writes: frozenset[str]  # arguments mutated but not returned (batch norm running stats): written
    dynamic_output: bool  # output shapes depend on tensor values (x[mask], nonzero, unique) or cannot be known
    batch_norm: bool  # one of BATCH_NORMS


def classify(
    func: torch._ops.OpOverload, plugins: dict[Any, PluginFormula], overrides: dict[Any, Formula]
) -> OpInfo:
    """``func``'s kind and schema facts; a plugin's formula (``plugins``) makes any op a priced one, an option's
    variant of a built-in formula (``overrides``) replaces it."""
    packet = func._overloadpacket
    name = packet.__name__
    schema = func._schema
    formula, plugin = lookup(func, plugins)
    if plugin is None and packet in overrides:
        formula = overrides[packet]
    if plugin is not None:
        kind = FORMULA
    elif func.is_view or packet in ALIASES:
        kind = VIEW
    elif packet in METADATA or func.namespace in ("prim", "profiler"):  # profiler: record_function markers
        kind = METADATA_QUERY
    elif packet in EMPTY_ALLOCATIONS:
        kind = ALLOCATION
    elif packet in FILLS:
        kind = FILL
    elif packet in GATHERS:
        kind = GATHER
    elif packet in DATA_MOVEMENT:
        kind = MOVEMENT
    else:
        kind = FORMULA if formula is not None else UNKNOWN
    mutated = {arg.name: arg for arg in schema.arguments if arg.alias_info is not None and arg.alias_info.is_write}
    returned_sets = set().union(*(r.alias_info.before_set for r in schema.returns if r.alias_info is not None))
    write_only = {arg_name for arg_name, arg in mutated.items() if arg.kwarg_only or packet in WRITE_ONLY_DESTINATION}
    return OpInfo(
        label=f"{func.namespace}.{name}",
        kind=kind,
        formula=formula,
        plugin=plugin,
        arg_names=tuple(arg.name for arg in schema.arguments),
        defaults={arg.name: arg.default_value for arg in schema.arguments if arg.has_default_value()},
        write_only=frozenset(write_only),
        unreturned_writes=frozenset(
            arg_name for arg_name, arg in mutated.items() if not arg.alias_info.before_set <= returned_sets
        ),
        dynamic_output=torch.Tag.dynamic_output_shape in func.tags or func.namespace != "aten",
        batch_norm=packet in BATCH_NORMS and plugin is None,
    )
