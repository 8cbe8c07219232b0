"""rpx's built-in plugins: ordinary pluggy plugins, one module per concern, listed and disabled like third-party ones.

Each module imports its runtime (torch, jax) inside hook implementations, so loading plugins stays fast. The engine
registers them by name from ``rpx_core.registry.manager.BUILTIN``.
"""
