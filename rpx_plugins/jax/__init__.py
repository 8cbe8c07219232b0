"""The JAX backend and its Tier 1 counts. ``JaxModel`` is the form every JAX model becomes (see adapters); importing
this package does not import jax."""

from rpx_plugins.jax.model import BUFFER, NON_TRAINABLE, TRAINABLE, JaxModel

__all__ = ["JaxModel", "TRAINABLE", "NON_TRAINABLE", "BUFFER"]
