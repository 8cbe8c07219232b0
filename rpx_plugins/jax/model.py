"""The one form every JAX model takes inside rpx: ``apply(params, *inputs, **named_inputs)`` and its params pytree,
each leaf with a role. The model adapters (:mod:`rpx_plugins.jax.adapters`) build it from what users have."""

from __future__ import annotations

from typing import Any, Callable

import attrs

from rpx_core.errors import UnsupportedError

#: The role of each params leaf, reported as torch reports parameters and buffers.
TRAINABLE, NON_TRAINABLE, BUFFER = "trainable", "non_trainable", "buffer"


@attrs.frozen
class JaxModel:
    """A JAX model: ``apply(params, *inputs, **named_inputs)`` and its ``params`` pytree.

    ``roles``: one of TRAINABLE, NON_TRAINABLE, BUFFER per leaf of ``params`` (``jax.tree.leaves`` order); None
    makes every leaf trainable. ``optimizer``: ``(params, grads) -> new params``, counted after the gradient when
    ``backward = true`` (grads has ``params``' structure, None at leaves that are not trainable). ``root_scope`` and
    ``ignored_scopes``: the name-stack component naming the model itself and prefixes of components that are not
    module names, dropped from module paths. ``form`` names the form the user gave, for messages.
    """

    apply: Callable[..., Any]
    params: Any
    roles: tuple[str, ...] | None = None
    optimizer: Callable[[Any, Any], Any] | None = None
    root_scope: str | None = None
    ignored_scopes: tuple[str, ...] = ()
    form: str = "JaxModel(apply, params)"

    def leaf_roles(self) -> list[str]:
        import jax

        count = len(jax.tree.leaves(self.params))
        if self.roles is None:
            return [TRAINABLE] * count
        if len(self.roles) != count:
            raise UnsupportedError(f"{self.form}: {len(self.roles)} roles for {count} params leaves")
        return list(self.roles)
