"""rpx's built-in plugins: ordinary pluggy plugins, one module per concern, listed and disabled like third-party ones.

Each module imports its runtime (torch, jax) inside hook implementations, so loading plugins stays fast.
"""

#: Short plugin name -> module. Registered in this order, before entry-point plugins.
BUILTIN = {
    "stages": "rpx_plugins.stages",
    "cpu": "rpx_plugins.cpu_backend",
    "system-card": "rpx_plugins.system_card",
}
