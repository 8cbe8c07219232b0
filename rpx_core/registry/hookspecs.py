"""Every hook an rpx plugin can implement: the registration hooks here, and one stage hook per declared stage.

**Registration hooks** (``rpx_register_*``) are called once on every plugin; each returns a list of registration
objects. A name two plugins register (a backend, a GPU, a stage) is an error only for a spec or command that uses the
name, and the spec's ``[choose]`` table settles it.

**Stage hooks** are not written here: every :class:`rpx_core.registry.stages.Stage` a plugin declares (the built-in ones in
``rpx_plugins/stages/``) gets the hook ``rpx_<stage name>(ctx)``. It receives a
:class:`rpx_core.execution.context.StageContext` (a RunContext for run-scoped stages) and *stops at the first non-None
result*: a plugin that handles only some backends returns None for the others (check ``ctx.backend.name``). Plugins
are asked third-party first, in alphabetical order of their entry-point names, and built-ins last (they are
``trylast``); ``@hookimpl(tryfirst=True)`` asks a plugin before the others, ``trylast=True`` after them.

Example plugin module (registered through the entry-point group ``rpx``)::

    from rpx_core.plugin import hookimpl

    @hookimpl
    def rpx_count_flops(ctx):
        if ctx.backend.name != "my-npu":
            return None          # let the built-in count for every other backend
        return my_npu_flops(ctx)
"""

from __future__ import annotations

import types
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy

PROJECT = "rpx"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

if TYPE_CHECKING:
    from rpx_core.registry.backends import Backend
    from rpx_core.registry.op_formula import OpFormula
    from rpx_core.registry.sources import ModelSource
    from rpx_core.registry.stages import Stage


# -- registration hooks ------------------------------------------------------------------------------------------------


@hookspec
def rpx_register_backends() -> list[Backend]:
    """Return the backends this plugin provides (instances of :class:`rpx_core.plugin.Backend` subclasses).

    Called on every plugin; results are collected. Example: ``return [MyNpuBackend()]``.
    """


@hookspec
def rpx_register_gpu_packs() -> list[Path]:
    """Return paths of GPU pack TOML files this plugin ships (the format: ``docs/plugins.md``, "The GPU-pack format").

    Called on every plugin; results are collected. Example: ``return [Path(__file__).with_name("my_gpus.toml")]``.
    """


@hookspec
def rpx_register_stages() -> list[Stage]:
    """Return new stages (:class:`rpx_core.plugin.Stage` declarations). Each gets its hook ``rpx_<name>(ctx)``;
    the declaring plugin implements it (usually ``trylast``, so other plugins can override it per backend).

    Called on every plugin; results are collected. Example:
    ``return [Stage("energy", "joules per call", result=EnergyResult, needs=("count_flops",))]``.
    """


@hookspec
def rpx_register_executors() -> list[Any]:
    """Return executors (instances of :class:`rpx_core.plugin.Executor` subclasses): where and when a run's jobs run
    (``local``: this machine; ``ray``: a Ray cluster). ``[execution] executor`` or ``rpx run --executor`` picks one.

    Called on every plugin; results are collected; a name two plugins register is an error. Import nothing heavy
    here (``rpx plugins`` calls it): import the cluster library in ``Executor.run``. Example:
    ``return [DaskExecutor()]``.
    """


# -- stage hooks -------------------------------------------------------------------------------------------------------


def stage_hook_specs(stages: Iterable[Stage]) -> Any:
    """A namespace holding the hookspec ``rpx_<name>(ctx)`` (first result wins) of each declared stage, for
    ``PluginManager.add_hookspecs``."""
    specs = {}
    for stage in stages:

        def spec(ctx: Any) -> Any: ...

        spec.__name__ = spec.__qualname__ = stage.hook
        spec.__doc__ = f"Stage {stage.name!r}: {stage.doc or stage.description}. First non-None result wins."
        specs[stage.hook] = hookspec(firstresult=True)(spec)
    return types.SimpleNamespace(**specs)


# -- operator formulas (registration hook) -----------------------------------------------------------------------------


@hookspec
def rpx_register_op_formulas() -> list[OpFormula]:
    """Return FLOP/byte formulas for operators rpx's counter has none for (custom ops) or prices otherwise
    (:class:`rpx_core.registry.op_formula.OpFormula`: ``op``, ``macs``, ``flops``, optional ``bytes``, each a function of one
    call). Called on every plugin; results are collected and resolved when a torch count starts, so ``op`` may be a
    string naming an operator registered later (``"mylib::fused_gelu"``); one that does not resolve is an error
    naming the plugin. A plugin's formula takes precedence over the built-in one; for an operator two plugins price,
    the first in plugin call order wins (tryfirst/trylast order them), and the result's ``plugin_formulas`` names
    the plugin that priced each operator. The hook is also called when plugins load (``rpx plugins``): import
    nothing heavy in it; name the module defining the operator as ``library``, imported when counting starts. Example::

        from rpx_core.plugin import OpFormula, cost_table, hookimpl

        @hookimpl
        def rpx_register_op_formulas():
            gelu = cost_table.GELU_ERF  # 5 FLOPs per element, as rpx prices an unfused GELU
            return [OpFormula("mylib::fused_gelu", flops=lambda call: gelu * call.out_numel(), library="mylib.ops")]
    """


# -- model adapters (models in the forms users have them) ---------------------------------------------------------------


@hookspec
def rpx_register_model_adapters() -> list[Any]:
    """Return model adapters (:class:`rpx_core.plugin.ModelAdapter`): each recognises one form of model object by
    type and converts it for the backends of its framework. The backend of a spec or ``rpx.profile`` call that names
    none is inferred from them. Called on every plugin; results are collected; names must be unique.

    Example: ``return [ModelAdapter("haiku", "jax", "haiku Transformed + params", is_haiku, to_jax_model)]``.
    """


# -- model sources (models by name) ------------------------------------------------------------------------------------


@hookspec
def rpx_register_model_sources() -> list[ModelSource]:
    """Return model sources (:class:`rpx_core.plugin.ModelSource`): each makes models named ``<scheme>:<target>``
    buildable from a spec (``source = "hf:gpt2"``) and from ``rpx profile``. Called on every plugin, also when plugins
    load: import nothing heavy in it (``build`` imports its library in the worker; ``requires`` names it so that
    ``rpx validate`` can say it is missing without importing it). A scheme two plugins register is an error where a
    spec uses it, settled by ``[choose.sources]``.

    Example: ``return [ModelSource("mylib", "MyLib architectures", build=build, inputs=inputs, requires=("mylib",))]``.
    """
