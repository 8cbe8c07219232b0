"""Small plain-JAX models for specs and tests, in the jax backend's convention (``JaxModel(apply, params)``).

Weights are drawn with numpy from a fixed seed (scaled normal, 1/sqrt(fan-in)), so every run profiles the same model
and building one compiles nothing (each eager jax.random call would be an XLA compile). Imported only when a spec names
one of these factories, so importing jax here costs nothing at CLI start.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rpx_plugins.jax.backend import JaxModel

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
