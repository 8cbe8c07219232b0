"""The JAX backend and its Tier 1 counts. ``JaxModel`` is the form every JAX model becomes (see adapters; defined in
rpx_core, re-exported here); importing this package does not import jax."""

from rpx_core.plugin import BUFFER, NON_TRAINABLE, TRAINABLE, JaxModel

__all__ = ["JaxModel", "TRAINABLE", "NON_TRAINABLE", "BUFFER"]
