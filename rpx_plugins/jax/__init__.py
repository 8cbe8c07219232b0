"""JAX plugins: the jax backend and the Tier 1 stage hooks that count a model's jaxpr."""
