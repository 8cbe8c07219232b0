"""rpx's built-in plugins: ordinary pluggy plugins, one module per concern, listed and disabled like third-party ones.

Each module imports its runtime (torch, jax) inside hook implementations, so loading plugins stays fast.
"""

#: Short plugin name -> module. Registered in this order, before entry-point plugins.
BUILTIN = {
    "stages": "rpx_plugins.stages",
    "cpu": "rpx_plugins.cpu_backend",
    "cuda": "rpx_plugins.cuda_backend",
    "mps": "rpx_plugins.mps_backend",
    "jax": "rpx_plugins.jax_backend",
    "jax-tier1": "rpx_plugins.jax_tier1",
    "torch-tier1": "rpx_plugins.torch_tier1",
    "reference-gpus": "rpx_plugins.reference_gpus",
    "roofline": "rpx_plugins.roofline",
    "system-card": "rpx_plugins.system_card",
    "latency": "rpx_plugins.latency",
    "batch-search": "rpx_plugins.batch_search",
}
