"""The plugin system: the plugin manager and everything plugins register.

:mod:`~rpx_core.registry.manager` loads plugins (built-in modules and entry points alike), owns every hook call
behind typed methods, and keeps one registry per kind of registration (backends, stages, GPU packs, model sources,
adapters, executors, operator formulas), where two plugins claiming one name is a clash that names both. The other
modules define what is registered: the hook contract, the Stage declaration, backends, model adapters and sources,
GPU packs, operator formulas. Plugins reach these through :mod:`rpx_core.plugin`.
"""
