"""JAX models as users have them, recognised by type and turned into a :class:`JaxModel` (see rpx_core.registry.adapters).

Forms (checked in this order):

* ``JaxModel(apply, params)`` as is; ``(apply, params)`` for a plain function: every leaf trainable.
* Flax linen: ``(module, variables)`` or ``(module, variables, apply_kwargs)`` (e.g. ``{"train": False}``), or a
  bound module (``module.bind(variables)``). The ``params`` collection is trainable, every other collection
  (``batch_stats``, ``cache``, ...) buffers; module paths come from linen's own name scopes.
* Flax NNX: a module. ``nnx.Param`` leaves are trainable, every other variable (``BatchStat``, ``RngKey``,
  ``RngCount``, ``Cache``) a buffer; rpx names a scope per submodule while counting.
* Equinox: a module. Array leaves are trainable (Equinox has no flag); static fields stay static; rpx names a scope per
  submodule while counting.
* Flax ``TrainState``: ``apply_fn({"params": params, ...})``; a ``batch_stats`` field (the usual subclass) is a
  buffer; its ``tx`` and ``opt_state`` are the optimizer update counted with ``backward = true``.

Each check looks in ``sys.modules`` first: an object cannot be a Flax module unless Flax is imported, so recognising a
torch model never imports Flax or Equinox.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import sys
from collections import Counter
from typing import Any, Callable, Iterator

from rpx_core.plugin import BUFFER, TRAINABLE, JaxModel, ModelAdapter

#: Counts module calls while a trace runs under ``recording_calls`` (None: not recording).
_CALLS: contextvars.ContextVar[Counter | None] = contextvars.ContextVar("rpx_jax_module_calls", default=None)


@contextlib.contextmanager
def recording_calls() -> Iterator[Counter]:
    """Count each module path's calls during a trace (the per-module breakdown's ``calls``)."""
    calls: Counter = Counter()
    token = _CALLS.set(calls)
    try:
        yield calls
    finally:
        _CALLS.reset(token)


def record_call(path: str) -> None:
    calls = _CALLS.get()
    if calls is not None and path:
        calls[path] += 1


def loaded(module: str) -> Any:
    return sys.modules.get(module)


# -- plain JAX ---------------------------------------------------------------------------------------------------------


def is_function_pair(model: Any) -> bool:
    linen = loaded("flax.linen")
    return (
        isinstance(model, tuple) and len(model) == 2 and callable(model[0])
        and not (linen is not None and isinstance(model[0], linen.Module))
    )


def from_function_pair(model: tuple[Callable[..., Any], Any]) -> JaxModel:
    return JaxModel(model[0], model[1], form="(apply, params)")


# -- Flax linen --------------------------------------------------------------------------------------------------------


def is_linen(model: Any) -> bool:
    linen = loaded("flax.linen")
    if linen is None:
        return False
    if isinstance(model, linen.Module):
        return model.scope is not None  # bound: it carries its variables
    return (
        isinstance(model, tuple) and len(model) in (2, 3) and isinstance(model[0], linen.Module)
        and (len(model) == 2 or isinstance(model[2], dict))
    )


def collection_roles(variables: Any, trainable: Callable[[str], bool]) -> tuple[str, ...]:
    """The role of each leaf of a ``{collection: tree}`` mapping, in ``jax.tree.leaves`` order."""
    import jax

    flat = jax.tree_util.tree_flatten_with_path(variables)[0]
    return tuple(TRAINABLE if trainable(path[0].key) else BUFFER for path, _ in flat)


def count_linen_calls(next_fun: Callable[..., Any], args: Any, kwargs: Any, context: Any) -> Any:
    if context.method_name == "__call__":
        record_call(".".join(str(part) for part in context.module.path))
    return next_fun(*args, **kwargs)


def from_linen(model: Any) -> JaxModel:
    from flax import linen

    if isinstance(model, linen.Module):
        module, variables, options = model.unbind() + ({},)
    else:
        module, variables, options = (*model, {}) if len(model) == 2 else model
    variables = dict(variables)

    def apply(variables: Any, *inputs: Any, **named: Any) -> Any:
        with linen.intercept_methods(count_linen_calls):
            return module.apply(variables, *inputs, **options, **named)

    roles = collection_roles(variables, lambda collection: collection == "params")
    return JaxModel(apply, variables, roles, root_scope=type(module).__name__, form="(flax linen module, variables)")


# -- module trees rpx names itself (NNX, Equinox) ----------------------------------------------------------------------


def module_paths(modules: list[tuple[tuple[Any, ...], Any]]) -> dict[int, str]:
    """id(module) -> its path below the root ("block.attn", "layers.0"); the root itself is left out."""
    paths: dict[int, str] = {}
    for path, module in modules:
        if path and id(module) not in paths:
            paths[id(module)] = ".".join(map(str, path))
    return paths


@contextlib.contextmanager
def named_calls(modules: list[tuple[tuple[Any, ...], Any]]) -> Iterator[None]:
    """While active, each listed module's ``__call__`` runs inside ``jax.named_scope`` of its path relative to the
    module calling it ("attn" inside "block", "layers.0" from the root), so the jaxpr's name stack carries module
    paths as linen's does, and its call is counted. Classes are patched and restored."""
    import jax

    paths = module_paths(modules)
    active: list[tuple[int, str]] = []
    patched: dict[type, Any] = {}

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            path = paths.get(id(self))
            if path is None or (active and active[-1][0] == id(self)):  # not ours, or a base class's __call__
                return original(self, *args, **kwargs)
            parent = active[-1][1] + "." if active else ""
            record_call(path)
            active.append((id(self), path))
            try:
                with jax.named_scope(path.removeprefix(parent) if path.startswith(parent) else path):
                    return original(self, *args, **kwargs)
            finally:
                active.pop()

        return call

    for cls in {type(module) for _, module in modules}:
        patched[cls] = cls.__dict__.get("__call__")
        type.__setattr__(cls, "__call__", wrap(cls.__call__))
    try:
        yield
    finally:
        for cls, original in patched.items():
            if original is None:
                type.__delattr__(cls, "__call__")
            else:
                type.__setattr__(cls, "__call__", original)


# -- Flax NNX ----------------------------------------------------------------------------------------------------------


def is_nnx(model: Any) -> bool:
    nnx = loaded("flax.nnx")
    return nnx is not None and isinstance(model, nnx.Module)


def from_nnx(model: Any) -> JaxModel:
    import jax
    from flax import nnx

    graphdef, state = nnx.split(model)
    variables = jax.tree_util.tree_flatten_with_path(state, is_leaf=lambda x: isinstance(x, nnx.Variable))[0]
    roles = tuple(TRAINABLE if isinstance(v, nnx.Param) else BUFFER for _, v in variables)

    def apply(state: Any, *inputs: Any, **named: Any) -> Any:
        module = nnx.merge(graphdef, state)
        with named_calls(list(nnx.iter_modules(module))):
            return module(*inputs, **named)

    return JaxModel(apply, state, roles, form="flax nnx Module")


# -- Equinox -----------------------------------------------------------------------------------------------------------


def is_equinox(model: Any) -> bool:
    eqx = loaded("equinox")
    return eqx is not None and isinstance(model, eqx.Module)


def equinox_modules(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """(path, module) of every Equinox module under ``node`` (fields, list/tuple items, dict values), root first."""
    import dataclasses

    import equinox as eqx

    if isinstance(node, eqx.Module):
        yield path, node
        for field in dataclasses.fields(node):
            yield from equinox_modules(getattr(node, field.name, None), (*path, field.name))
    elif isinstance(node, (list, tuple)):
        for index, item in enumerate(node):
            yield from equinox_modules(item, (*path, index))
    elif isinstance(node, dict):
        for key, item in node.items():
            yield from equinox_modules(item, (*path, key))


def from_equinox(model: Any) -> JaxModel:
    import equinox as eqx

    params, static = eqx.partition(model, eqx.is_array)

    def apply(params: Any, *inputs: Any, **named: Any) -> Any:
        module = eqx.combine(params, static)
        with named_calls(list(equinox_modules(module))):
            return module(*inputs, **named)

    return JaxModel(apply, params, ignored_scopes=("eqx.",), form="Equinox Module")


# -- Flax TrainState ---------------------------------------------------------------------------------------------------


def is_train_state(model: Any) -> bool:
    train_state = loaded("flax.training.train_state")
    return train_state is not None and isinstance(model, train_state.TrainState)


def from_train_state(state: Any) -> JaxModel:
    import jax

    variables = {"params": state.params}
    if getattr(state, "batch_stats", None) is not None:
        variables["batch_stats"] = state.batch_stats

    linen = loaded("flax.linen")

    def apply(variables: Any, *inputs: Any, **named: Any) -> Any:
        with linen.intercept_methods(count_linen_calls) if linen is not None else contextlib.nullcontext():
            return state.apply_fn(variables, *inputs, **named)

    def optimizer(variables: Any, grads: Any) -> Any:
        """The TrainState's own step: ``tx.update`` then ``params + updates`` (optax.apply_updates)."""
        updates, _ = state.tx.update(grads["params"], state.opt_state, variables["params"])
        params = jax.tree.map(lambda p, u: (p + u).astype(p.dtype), variables["params"], updates)
        return {**variables, "params": params}

    roles = collection_roles(variables, lambda collection: collection == "params")
    root = getattr(getattr(state.apply_fn, "__self__", None), "__class__", None)
    return JaxModel(apply, variables, roles, optimizer, root_scope=root.__name__ if root else None,
                    form="flax TrainState")


BUILTIN = (
    ModelAdapter("jax-model", "jax", "JaxModel(apply, params)", lambda m: isinstance(m, JaxModel), lambda m: m),
    ModelAdapter("jax-function", "jax", "(apply, params)", is_function_pair, from_function_pair),
    ModelAdapter("flax-linen", "jax", "(flax linen module, variables[, apply kwargs]) or a bound linen module",
                 is_linen, from_linen),
    ModelAdapter("flax-nnx", "jax", "flax nnx Module", is_nnx, from_nnx),
    ModelAdapter("equinox", "jax", "Equinox Module", is_equinox, from_equinox),
    ModelAdapter("flax-train-state", "jax", "flax TrainState", is_train_state, from_train_state),
)
