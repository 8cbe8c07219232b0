"""Small JAX models for specs and tests: plain JAX (``JaxModel(apply, params)``), the forms Flax linen, Flax NNX,
Equinox and a Flax TrainState give (each factory imports its library when called), and programs over a device mesh.

Plain-JAX weights are drawn with numpy from a fixed seed (scaled normal, 1/sqrt(fan-in)), so every run profiles the same model
and building one compiles nothing (each eager jax.random call would be an XLA compile). Imported only when a spec names
one of these factories, so importing jax here costs nothing at CLI start.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rpx_core.plugin import JaxModel

NCHW = ("NCHW", "OIHW", "NCHW")  # images channels-first, kernels [out, in, h, w]


def scaled_normal(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int) -> jax.Array:
    return jnp.asarray(rng.standard_normal(shape, np.float32) / np.sqrt(fan_in, dtype=np.float32))


def dense_params(rng: np.random.Generator, fan_in: int, fan_out: int) -> dict[str, Any]:
    return {"w": scaled_normal(rng, (fan_in, fan_out), fan_in), "b": jnp.asarray(np.zeros(fan_out, np.float32))}


def mlp_apply(params: list[dict[str, Any]], x: Any) -> Any:
    """Dense layers with ReLU between them (none after the last)."""
    for layer in params[:-1]:
        x = jax.nn.relu(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def mlp(sizes: Sequence[int] = (64, 128, 10), seed: int = 0) -> JaxModel:
    """An MLP with layer widths ``sizes`` (input features first): input [batch, sizes[0]] -> [batch, sizes[-1]]."""
    rng = np.random.default_rng(seed)
    return JaxModel(mlp_apply, [dense_params(rng, fan_in, fan_out) for fan_in, fan_out in zip(sizes[:-1], sizes[1:])])


def cnn_apply(params: dict[str, Any], images: Any) -> Any:
    """3x3 convolution (SAME padding) + ReLU, global average pool, dense head. Images are NCHW."""
    features = jax.lax.conv_general_dilated(images, params["conv"], (1, 1), "SAME", dimension_numbers=NCHW)
    pooled = jax.nn.relu(features).mean(axis=(2, 3))
    return pooled @ params["head"]["w"] + params["head"]["b"]


def tiny_cnn(channels: int = 3, features: int = 16, classes: int = 10, seed: int = 0) -> JaxModel:
    """A one-convolution classifier: input [batch, channels, H, W] -> [batch, classes]."""
    rng = np.random.default_rng(seed)
    conv = scaled_normal(rng, (features, channels, 3, 3), channels * 9)
    return JaxModel(cnn_apply, {"conv": conv, "head": dense_params(rng, features, classes)})


# -- models as JAX libraries write them (Flax, Equinox); each imports its library when called --------------------------


def linen_cnn(features: int = 8, classes: int = 10, seed: int = 0) -> tuple[Any, Any, dict[str, Any]]:
    """A Flax linen CNN with batch norm, as ``(module, variables, {"train": False})``: 3x3 conv (SAME) -> batch norm
    (running averages) -> ReLU -> global mean -> dense head. Input NHWC [batch, H, W, 3]."""
    from flax import linen as nn

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x: Any, train: bool = False) -> Any:
            x = nn.Conv(features, (3, 3))(x)
            x = nn.BatchNorm(use_running_average=not train)(x)
            return nn.Dense(classes)(nn.relu(x).mean(axis=(1, 2)))

    module = CNN()
    return module, module.init(jax.random.key(seed), jnp.ones((1, 8, 8, 3))), {"train": False}


def linen_attention(width: int = 64, heads: int = 4, seed: int = 0) -> tuple[Any, Any]:
    """A Flax linen pre-norm self-attention block: layer norm -> multi-head self-attention -> residual. Input
    [batch, sequence, width]."""
    from flax import linen as nn

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            return x + nn.MultiHeadDotProductAttention(num_heads=heads, qkv_features=width)(nn.LayerNorm()(x))

    module = Block()
    return module, module.init(jax.random.key(seed), jnp.ones((1, 4, width)))


def nnx_mlp(sizes: Sequence[int] = (64, 32, 10), seed: int = 0) -> Any:
    """A Flax NNX MLP with batch norm and dropout after the first layer, in eval mode: Linear -> BatchNorm -> ReLU ->
    Dropout -> Linear ... (the BatchNorm's statistics and Dropout's RNG state are buffers)."""
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, rngs: Any) -> None:
            self.layers = nnx.List([nnx.Linear(i, o, rngs=rngs) for i, o in zip(sizes[:-1], sizes[1:])])
            self.norm = nnx.BatchNorm(sizes[1], rngs=rngs)
            self.dropout = nnx.Dropout(0.1, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            x = self.dropout(nnx.relu(self.norm(self.layers[0](x))))
            for layer in self.layers[1:]:
                x = layer(x)
            return x

    model = MLP(nnx.Rngs(seed))
    model.eval()
    return model


def equinox_mlp(sizes: Sequence[int] = (64, 32, 10), seed: int = 0) -> Any:
    """An Equinox MLP over a batch (vmapped eqx.nn.Linear layers, ReLU between): input [batch, sizes[0]]."""
    import equinox as eqx

    class MLP(eqx.Module):
        layers: list

        def __init__(self, key: Any) -> None:
            keys = jax.random.split(key, len(sizes) - 1)
            self.layers = [eqx.nn.Linear(i, o, key=k) for i, o, k in zip(sizes[:-1], sizes[1:], keys)]

        def __call__(self, x: Any) -> Any:
            for layer in self.layers[:-1]:
                x = jax.nn.relu(jax.vmap(layer)(x))
            return jax.vmap(self.layers[-1])(x)

    return MLP(jax.random.key(seed))


def train_state_mlp(sizes: Sequence[int] = (64, 32, 10), learning_rate: float = 0.1, seed: int = 0) -> Any:
    """A Flax TrainState of a linen MLP (Dense -> ReLU -> Dense ...) with plain SGD (optax.sgd)."""
    import optax
    from flax import linen as nn
    from flax.training import train_state

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            for width in sizes[1:-1]:
                x = nn.relu(nn.Dense(width)(x))
            return nn.Dense(sizes[-1])(x)

    module = MLP()
    params = module.init(jax.random.key(seed), jnp.ones((1, sizes[0])))["params"]
    return train_state.TrainState.create(apply_fn=module.apply, params=params, tx=optax.sgd(learning_rate))


# -- programs over a mesh of every device JAX sees -----------------------------------------------------------------------


def device_mesh(axis: str = "devices") -> Any:
    return jax.sharding.Mesh(np.array(jax.devices()), (axis,))


def sharded_mlp(sizes: Sequence[int] = (64, 128, 10), seed: int = 0) -> JaxModel:
    """The plain MLP with its hidden layer's weights split over every device (column- then row-parallel, as in
    Megatron); XLA's SPMD partitioner shards the program from the params' shardings."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = device_mesh()
    model = mlp(sizes, seed)
    specs = [{"w": P(None, "devices"), "b": P("devices")}, *[{"w": P("devices", None), "b": P()}] * (len(sizes) - 2)]
    params = [jax.device_put(layer, {k: NamedSharding(mesh, spec[k]) for k in layer}) for layer, spec in
              zip(model.params, specs)]
    return JaxModel(model.apply, params)


def shard_map_mlp(sizes: Sequence[int] = (64, 128, 10), seed: int = 0) -> JaxModel:
    """A two-layer MLP written with ``jax.shard_map``, tensor-parallel over every device: each device holds a slice
    of the hidden layer (columns of the first weight, rows of the second), computes its partial output, and a psum
    adds the partials. The input is replicated, so any batch size runs."""
    from jax.sharding import PartitionSpec as P

    first, second = mlp(sizes[:3], seed).params
    mesh = device_mesh()

    def per_device(params: dict[str, Any], x: Any) -> Any:
        hidden = jax.nn.relu(x @ params["w1"] + params["b1"])
        return jax.lax.psum(hidden @ params["w2"], "devices") + params["b2"]

    specs = {"w1": P(None, "devices"), "b1": P("devices"), "w2": P("devices", None), "b2": P()}
    apply = jax.shard_map(per_device, mesh=mesh, in_specs=(specs, P()), out_specs=P())
    params = {"w1": first["w"], "b1": first["b"], "w2": second["w"], "b2": second["b"]}
    return JaxModel(apply, params)


def data_parallel_mlp(sizes: Sequence[int] = (64, 128, 10), seed: int = 0) -> JaxModel:
    """The plain MLP written with ``jax.shard_map``, data-parallel over every device: the params are replicated and
    the batch is split, so the batch must divide by the device count (a batch of 1 cannot run on 2 devices)."""
    from jax.sharding import PartitionSpec as P

    model = mlp(sizes, seed)
    apply = jax.shard_map(mlp_apply, mesh=device_mesh(), in_specs=(P(), P("devices")), out_specs=P("devices"))
    return JaxModel(apply, model.params)


def function_mlp(sizes: Sequence[int] = (64, 32, 10), seed: int = 0) -> tuple[Any, Any]:
    """The plain MLP as a user writes it without a library: an ``(apply, params)`` tuple."""
    model = mlp(sizes, seed)
    return model.apply, model.params


def pmap_mlp(sizes: Sequence[int] = (64, 128, 10), seed: int = 0) -> JaxModel:
    """The plain MLP under ``jax.pmap``: input [devices, batch, sizes[0]], one slice per device (JAX runs pmap as a
    shard_map over every device)."""
    model = mlp(sizes, seed)
    return JaxModel(jax.pmap(mlp_apply, in_axes=(None, 0)), model.params)
