"""Loading plugins and every call into them, behind typed methods (the rest of rpx never touches ``pm.hook``).

Built-in plugins (``BUILTIN``, modules of rpx_plugins) and third-party ones (entry-point group ``rpx``) load the same
way, so both are listed and disabled alike. Loading is defensive so that ``rpx plugins`` can always show what is wrong:

* a plugin that fails to import, or whose registration hook raises or returns anything but a list of its
  registration objects (rpx_core.registry.returns), is left out with a warning naming it (an error with ``strict``):
  one broken plugin never stops the tool;
* a plugin whose hooks are malformed (an unknown ``rpx_*`` name, wrong argument names, a hook wrapper) is *invalid*:
  it is not registered, ``rpx plugins`` shows why, and every other command refuses to run with that one line;
* a function named like a hook but missing ``@hookimpl`` is registered as if it had it (as pytest does);
* a name two plugins register (backend, GPU, stage) is an error only where that name is used; ``[choose]`` settles it.

Call order of a stage hook: third-party plugins in alphabetical order of their names, then the built-ins (``trylast``);
``tryfirst``/``trylast`` on a hook implementation move it to the front or the back.
"""

from __future__ import annotations

import contextvars
import importlib
import importlib.metadata
import inspect
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import attrs
import pluggy

from rpx_core.errors import BackendUnavailable, PluginError, RpxError, choose_one_of, did_you_mean
from rpx_core.registry import hookspecs
from rpx_core.results.records import PluginInfo
from rpx_core.version import __version__

if TYPE_CHECKING:
    from rpx_core.registry.adapters import ModelAdapter
    from rpx_core.registry.backends import Backend
    from rpx_core.registry.gpus import GPUCatalog
    from rpx_core.registry.op_formula import OpFormula
    from rpx_core.registry.sources import ModelSource
    from rpx_core.registry.stages import Stage
    from rpx_core.spec.schema import Choices

ENTRY_POINT_GROUP = "rpx"
DISABLE_ENV = "RPX_DISABLE_PLUGINS"  # comma-separated plugin names
STRICT_ENV = "RPX_STRICT_PLUGINS"  # "1": a plugin that fails to import is an error
GPU_PACKS_ENV = "RPX_GPU_PACKS"  # extra GPU pack TOML files, separated like PATH
TRACE_ENV = "RPX_TRACE_HOOKS"  # "1": print every stage hook call and the plugin that answered to stderr
PREFIX = f"{hookspecs.PROJECT}_"
REGISTRATION_HOOKS = tuple(name for name in dir(hookspecs) if name.startswith(f"{PREFIX}register_"))

#: The built-in plugins (modules of rpx_plugins), by short name, registered in this order before entry-point plugins
#: and listed and disabled exactly like them.
BUILTIN = {
    "stages": "rpx_plugins.stages",
    "cpu": "rpx_plugins.torch.cpu",
    "cuda": "rpx_plugins.torch.cuda",
    "mps": "rpx_plugins.torch.mps",
    "jax": "rpx_plugins.jax.backend",
    "jax-counts": "rpx_plugins.jax.counts",
    "torch-counts": "rpx_plugins.torch.counts",
    "reference-gpus": "rpx_plugins.reference_gpus",
    "roofline": "rpx_plugins.roofline.stage",
    "system-card": "rpx_plugins.system_card",
    "latency": "rpx_plugins.latency",
    "batch-search": "rpx_plugins.batch_search.stage",
    "serving": "rpx_plugins.serving.stage",
    "breakdown-torch": "rpx_plugins.breakdown.torch_stage",
    "breakdown-jax": "rpx_plugins.breakdown.jax_stage",
    "model-sources": "rpx_plugins.sources",
    "local-executor": "rpx_plugins.executors.local",
    "ray-executor": "rpx_plugins.executors.ray",
}

T = TypeVar("T")


class PluginLoadWarning(UserWarning):
    """A third-party plugin could not be imported; rpx runs without it."""


class StageHookError(Exception):
    """A stage hook implementation raised: carries the plugin that was answering, so the failure names it."""

    def __init__(self, plugin: str, error: BaseException) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.plugin = plugin
        self.error = error


def disabled_from_env() -> set[str]:
    return {name.strip() for name in os.environ.get(DISABLE_ENV, "").split(",") if name.strip()}


class _Manager(pluggy.PluginManager):
    """pluggy's manager, also taking ``rpx_*`` functions without ``@hookimpl``: a forgotten marker must not make an
    implementation silently disappear."""

    def parse_hookimpl_opts(self, plugin: Any, name: str) -> Any:
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is None and name.startswith(PREFIX) and inspect.isroutine(getattr(plugin, name, None)):
            return {}
        return opts


@attrs.frozen
class Registry(Generic[T]):
    """Names a registration hook returned -> the objects; a name several plugins registered is an error only when it
    is looked up (unless ``chosen`` picks a plugin), so one clash never breaks commands that do not use the name."""

    kind: str  # "backend", "stage": for messages and the [choose] table name
    candidates: dict[str, list[tuple[T, str]]]  # name -> (object, plugin name) per registering plugin
    chosen: dict[str, str]  # name -> plugin name, from the spec's [choose] table
    describe: Callable[[str], str]  # plugin name -> "plugin 'x' (dist version)"

    def __contains__(self, name: object) -> bool:
        return name in self.candidates

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self.candidates))

    def __len__(self) -> int:
        return len(self.candidates)

    def __getitem__(self, name: str) -> T:
        return self.entry(name)[0]

    def provider(self, name: str) -> str:
        """The plugin whose registration of ``name`` is used."""
        return self.entry(name)[1]

    def entry(self, name: str) -> tuple[T, str]:
        options = self.candidates[name]
        if name in self.chosen:
            picked = [option for option in options if option[1] == self.chosen[name]]
            if not picked:
                providers = ", ".join(repr(plugin) for _, plugin in options)
                raise PluginError(f"choose.{self.kind}s.{name}: {self.chosen[name]!r} does not register {self.kind} "
                                  f"{name!r}; it is registered by {providers}")
            return picked[0]
        if len(options) > 1:
            (_, first), (_, second) = options[:2]
            raise PluginError(
                f"{self.kind} {name!r} is registered by {self.describe(first)} and by {self.describe(second)}; "
                f'choose one in the spec: [choose.{self.kind}s] "{name}" = "{first}"'
            )
        return options[0]

    def clashes(self) -> dict[str, list[str]]:
        """Names registered by several plugins and not settled by a choice -> those plugins."""
        return {name: [plugin for _, plugin in options] for name, options in self.candidates.items()
                if len(options) > 1 and name not in self.chosen}

    def unambiguous(self) -> dict[str, T]:
        """Every name with exactly one usable registration (for listings)."""
        return {name: self[name] for name in self if name not in self.clashes()}

    def in_load_order(self) -> dict[str, T]:
        """Every name with one usable registration, plugins in the order they were loaded (built-ins first), each
        plugin's names in the order it returned them: the order tables and figures are shown in."""
        usable = [name for name in self.candidates if name not in self.clashes()]
        by_plugin: dict[str, list[str]] = {}
        for name in usable:
            by_plugin.setdefault(self.provider(name), []).append(name)
        return {name: self[name] for names in reversed(by_plugin.values()) for name in names}


class Plugins:
    """The loaded plugin set of one rpx process."""

    def __init__(self, manager: _Manager, infos: list[PluginInfo]) -> None:
        self._pm = manager
        self._infos = infos
        self._stage_specs: set[str] = set()

    # -- loading -------------------------------------------------------------------------------------------------------

    @classmethod
    def load(cls, disabled: Iterable[str] = (), *, strict: bool | None = None, entry_points: bool = True,
             tolerant: bool = False) -> Plugins:
        """Register built-in plugins, then entry-point plugins, skipping ``disabled`` (plus ``RPX_DISABLE_PLUGINS``).

        An invalid plugin is an error unless ``tolerant`` (``rpx plugins`` loads tolerantly to show it)."""
        disabled = set(disabled) | disabled_from_env()
        strict = os.environ.get(STRICT_ENV) == "1" if strict is None else strict
        manager = _Manager(hookspecs.PROJECT)
        manager.add_hookspecs(hookspecs)
        plugins = cls(manager, [])
        for name, module_name in BUILTIN.items():
            if name in disabled:
                plugins._infos.append(PluginInfo(name, "rpx", __version__, True, "disabled"))
            else:
                plugins._register(importlib.import_module(module_name), name, "rpx", __version__, builtin=True)
        if entry_points:
            # Registered in reverse alphabetical order: pluggy asks the last registered first, so calls go a, b, c.
            found = sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name, reverse=True)
            for entry_point in found:
                plugins._load_entry_point(entry_point, disabled, strict)
        unknown = disabled - {info.name for info in plugins._infos}
        if unknown:
            warnings.warn(f"cannot disable unknown plugin(s): {', '.join(sorted(unknown))}", PluginLoadWarning, stacklevel=2)
        plugins._probe_registrations(strict)
        plugins._add_stage_hooks()
        plugins._refuse_unknown_hooks()
        invalid = [info for info in plugins._infos if info.status == "invalid"]
        if invalid and not tolerant:
            raise PluginError("; ".join(info.error or info.name for info in invalid) + " (see `rpx plugins`)")
        return plugins

    def _load_entry_point(self, entry_point: importlib.metadata.EntryPoint, disabled: set[str], strict: bool) -> None:
        dist = entry_point.dist
        dist_name, version = (dist.metadata["Name"], dist.version) if dist else ("unknown", "unknown")
        if entry_point.name in disabled:
            self._infos.append(PluginInfo(entry_point.name, dist_name, version, False, "disabled"))
            return
        if self._pm.has_plugin(entry_point.name):
            self._infos.append(PluginInfo(entry_point.name, dist_name, version, False, "invalid", error=(
                f"plugin name {entry_point.name!r} from {dist_name} {version} is already taken by "
                f"{self.describe(entry_point.name)}")))
            return
        try:
            plugin = entry_point.load()
        except Exception as exc:
            message = f"plugin {entry_point.name!r} ({dist_name} {version}) failed to import: {type(exc).__name__}: {exc}"
            if strict:
                raise PluginError(message) from exc
            warnings.warn(message + f" (continuing without it; set {STRICT_ENV}=1 to make this an error)", PluginLoadWarning, stacklevel=3)
            self._infos.append(PluginInfo(entry_point.name, dist_name, version, False, "failed", error=str(exc)))
            return
        self._register(plugin, entry_point.name, dist_name, version, builtin=False)

    def _register(self, plugin: Any, name: str, dist_name: str, version: str, *, builtin: bool) -> None:
        problem = self._hook_problem(plugin, name)
        if problem is None:
            try:
                self._pm.register(plugin, name=name)
            except (pluggy.PluginValidationError, ValueError) as exc:
                problem = f"plugin {name!r}: {str(exc).splitlines()[-1]}"
        if problem is not None:
            self._infos.append(PluginInfo(name, dist_name, version, builtin, "invalid", error=problem))
            return
        self._infos.append(PluginInfo(name, dist_name, version, builtin, "loaded", self._hooks_of(plugin)))

    def _hook_problem(self, plugin: Any, name: str) -> str | None:
        """Why ``plugin``'s hooks cannot be registered (a wrapper, or arguments its hook does not pass), or None."""
        for attribute in dir(plugin):
            opts = self._pm.parse_hookimpl_opts(plugin, attribute)
            if opts is None:
                continue
            if opts.get("wrapper") or opts.get("hookwrapper"):
                return f"plugin {name!r}: {attribute!r} is a hook wrapper, which rpx does not support"
            caller = getattr(self._pm.hook, attribute, None)
            expected = tuple(caller.spec.argnames) if caller is not None and caller.spec is not None else ("ctx",)
            if not attribute.startswith(f"{PREFIX}register_") or caller is not None:
                problem = _argument_problem(name, attribute, getattr(plugin, attribute), expected)
                if problem:
                    return problem
        return None

    def _hooks_of(self, plugin: Any) -> tuple[str, ...]:
        return tuple(sorted(impl.name for impl in self._pm.get_hookcallers(plugin) or ()))

    def _probe_registrations(self, strict: bool, only: str | None = None) -> None:
        """Call every registration hook once (of plugin ``only``, when given): a plugin whose registration raises or
        returns something else than its registration objects is left out, named with the problem."""
        from rpx_core.registry.returns import registration_problem

        for hook in REGISTRATION_HOOKS:
            for impl in _implementations(getattr(self._pm.hook, hook)):
                if only is not None and impl.plugin_name != only:
                    continue
                try:
                    problem = registration_problem(hook, impl.function())
                except Exception as exc:
                    problem = f"{hook} raised {type(exc).__name__}: {exc}"
                if problem:
                    self._leave_out(impl.plugin_name, f"plugin {impl.plugin_name!r}: {problem}", strict)

    def _leave_out(self, name: str, reason: str, strict: bool) -> None:
        """Unregister a plugin whose registration is broken and say so once (``rpx plugins`` lists it as failed)."""
        if strict:
            raise PluginError(reason)
        self._pm.unregister(name=name)
        self._infos = [attrs.evolve(info, status="failed", error=reason, hooks=()) if info.name == name else info
                       for info in self._infos]
        warnings.warn(f"{reason} (continuing without it; set {STRICT_ENV}=1 to make this an error)", PluginLoadWarning,
                      stacklevel=4)

    def _add_stage_hooks(self) -> None:
        """Give every declared stage its hook spec, so its implementations are checked and called like any hook."""
        names = [name for name in self.stages().candidates if f"{PREFIX}{name}" not in self._stage_specs]
        stages = [self.stages().candidates[name][0][0] for name in names]
        if stages:
            self._pm.add_hookspecs(hookspecs.stage_hook_specs(stages))
            self._stage_specs.update(stage.hook for stage in stages)

    def _refuse_unknown_hooks(self) -> None:
        """An ``rpx_*`` function that is no hook is a typo that would never be called: that plugin is invalid."""
        known = {name for name in vars(self._pm.hook) if not name.startswith("_")
                 and getattr(self._pm.hook, name).spec is not None}
        for hook_name in sorted(vars(self._pm.hook)):
            caller = getattr(self._pm.hook, hook_name)
            if hook_name.startswith("_") or caller.spec is not None:
                continue
            for impl in caller.get_hookimpls():
                self._invalidate(impl.plugin_name, f"plugin {impl.plugin_name!r}: {hook_name!r} is not an rpx hook"
                                 f"{did_you_mean(hook_name, known)}")

    def _invalidate(self, name: str, reason: str) -> None:
        self._pm.unregister(name=name)
        self._infos = [attrs.evolve(info, status="invalid", error=reason, hooks=()) if info.name == name else info
                       for info in self._infos]

    def register(self, plugin: Any, name: str) -> None:
        """Register a plugin object at run time (notebooks, tests); it is asked before the built-ins."""
        self._register(plugin, name, "<runtime>", "-", builtin=False)
        if self._pm.has_plugin(name):
            try:
                self._probe_registrations(strict=True, only=name)
            except PluginError:
                self.unregister(name)
                raise
        self._add_stage_hooks()
        self._refuse_unknown_hooks()
        info = self._info(name)
        if info.status == "invalid":
            self._infos.remove(info)
            raise PluginError(info.error or f"plugin {name!r} is invalid")

    def unregister(self, name: str) -> None:
        if self._pm.has_plugin(name):
            self._pm.unregister(name=name)
        self._infos = [info for info in self._infos if info.name != name]

    # -- introspection -------------------------------------------------------------------------------------------------

    def infos(self) -> list[PluginInfo]:
        return list(self._infos)

    def _info(self, plugin_name: str) -> PluginInfo:
        return next(info for info in reversed(self._infos) if info.name == plugin_name)

    def describe(self, plugin_name: str) -> str:
        """``plugin 'x' (distribution version)``, for messages that name a provider."""
        info = self._info(plugin_name)
        return f"plugin {plugin_name!r} ({info.distribution} {info.version})"

    def files(self) -> list[tuple[Path, str]]:
        """Where the loaded plugins' code and shipped GPU packs are, each with what it is, for the list of files no
        command may write over (rpx_core.spec.inputs): a plugin module's file, or its top-level package's folder, and
        each pack file it registers. A pack hook that raises or returns anything but paths adds nothing here: it
        is reported where the packs are loaded."""
        found = [(location, f"code of plugin {name!r}") for name, plugin in self._pm.list_name_plugin()
                 if (location := code_location(plugin)) is not None]
        for impl in _implementations(self._pm.hook.rpx_register_gpu_packs):
            try:
                paths = impl.function() or ()
            except Exception:
                continue
            if isinstance(paths, (list, tuple)):
                found.extend((Path(path), f"a GPU pack of plugin {impl.plugin_name!r}") for path in paths
                             if isinstance(path, (str, os.PathLike)))
        return found

    def hook_order(self, hook: str) -> list[str]:
        """The plugins implementing ``hook``, in the order they are asked."""
        caller = getattr(self._pm.hook, hook, None)
        return [impl.plugin_name for impl in _implementations(caller)] if caller is not None else []

    def problems(self) -> list[str]:
        """Everything wrong with the plugin set, one line each: invalid or failed plugins, GPU packs of plugins that
        do not load, and unsettled name clashes (GPUs included)."""
        from rpx_core.registry.gpus import GPUCatalog

        lines = [f"{info.name}: {info.status}: {info.error}" for info in self._infos if info.status in ("invalid", "failed")]
        for registry in (self.backends(), self.stages(), self.model_sources()):
            for name, providers in registry.clashes().items():
                lines.append(f"{registry.kind} {name!r} is registered by {', '.join(map(repr, providers))}; "
                             f"choose one with [choose.{registry.kind}s]")
        packs, broken = self._plugin_packs()
        return lines + broken + GPUCatalog(packs).conflicts()

    # -- registrations -------------------------------------------------------------------------------------------------

    def _collect(self, hook: str, key: Callable[[T], str], kind: str, chosen: Mapping[str, str]) -> Registry[T]:
        """Call a registration hook plugin by plugin; a plugin whose hook raises is named in the error."""
        candidates: dict[str, list[tuple[T, str]]] = {}
        for impl in _implementations(getattr(self._pm.hook, hook)):
            try:
                items = impl.function() or ()
            except Exception as exc:
                raise PluginError(f"plugin {impl.plugin_name!r}: {hook} raised {type(exc).__name__}: {exc}") from exc
            for item in items:
                candidates.setdefault(key(item), []).append((item, impl.plugin_name))
        return Registry(kind, candidates, dict(chosen), self.describe)

    def backends(self, choose: Choices | None = None) -> Registry[Backend]:
        return self._collect("rpx_register_backends", lambda b: b.name, "backend", choose.backends if choose else {})

    def backend(self, name: str, choose: Choices | None = None, *, require_available: bool = True) -> Backend:
        """The named backend; an unknown name or an unavailable backend is one clear error."""
        backends = self.backends(choose)
        if name not in backends:
            raise RpxError(f"backend {name!r} not recognized. {choose_one_of(name, backends)}")
        backend = backends[name]
        if require_available and not backend.availability.available:
            raise BackendUnavailable(f"backend {name!r} is not available on this machine: {backend.availability.reason}")
        return backend

    def model_adapters(self) -> list[ModelAdapter]:
        """Every registered model adapter, in plugin call order (a name two plugins register is an error)."""
        registry = self._collect("rpx_register_model_adapters", lambda a: a.name, "model adapter", {})
        return [registry[name] for name in registry.candidates]

    def model_sources(self, choose: Choices | None = None) -> Registry[ModelSource]:
        """Every model source by scheme (``hf``, ``torchvision``, ...); a scheme two plugins register is an error
        where it is used, unless ``[choose.sources]`` picks one."""
        return self._collect("rpx_register_model_sources", lambda s: s.scheme, "source", choose.sources if choose else {})

    def executors(self) -> Registry[Any]:
        """Every registered executor (rpx_core.execution.executors.Executor) by name; ``[execution] executor`` picks one."""
        return self._collect("rpx_register_executors", lambda e: e.name, "executor", {})

    def stages(self, choose: Choices | None = None) -> Registry[Stage]:
        return self._collect("rpx_register_stages", lambda s: s.name, "stage", choose.stages if choose else {})

    def gpu_catalog(self, extra_packs: Iterable[Path] = (), choose: Choices | None = None) -> GPUCatalog:
        """Every GPU from plugin packs, the user's pack files and ``RPX_GPU_PACKS``; clashing names need
        ``[choose.gpus]``. Never raises: a pack of the user's that does not load is left out with every problem it
        has in ``catalog.problems``; a plugin's is left out with a warning naming the plugin."""
        from rpx_core.registry.gpus import GPUCatalog, GPUPackError, load_pack

        packs, broken = self._plugin_packs()
        for line in broken:
            warnings.warn(line, PluginLoadWarning, stacklevel=2)
        problems = []
        from_env = [(Path(path), GPU_PACKS_ENV) for path in os.environ.get(GPU_PACKS_ENV, "").split(os.pathsep) if path]
        for path, given_by in [*((Path(path), "gpu_packs") for path in extra_packs), *from_env]:
            try:
                packs.append(load_pack(path, provider=str(path)))
            except GPUPackError as exc:
                problems += [f"{given_by}: {line}" for line in str(exc).splitlines()]
        return GPUCatalog(packs, choose=choose.gpus if choose else {}, problems=problems)

    def _plugin_packs(self) -> tuple[list[Any], list[str]]:
        """The GPU packs plugins ship, and a line for each problem of those that do not load."""
        from rpx_core.registry.gpus import GPUPackError, load_pack

        packs, problems = [], []
        for impl in _implementations(self._pm.hook.rpx_register_gpu_packs):
            info = self._info(impl.plugin_name)
            for path in impl.function() or ():  # checked when the plugin loaded (rpx_core.registry.returns)
                path = Path(path) if isinstance(path, (str, os.PathLike)) else path  # or a Traversable
                try:
                    packs.append(load_pack(path, provider=f"{info.distribution} {info.version}"))
                except GPUPackError as exc:
                    problems += [f"plugin {impl.plugin_name!r}: GPU pack left out: {line}"
                                 for line in str(exc).splitlines()]
        return packs, problems

    # -- operator formulas ---------------------------------------------------------------------------------------------

    def op_formulas(self) -> list[OpFormula]:
        """Every plugin's operator formulas (``rpx_register_op_formulas``), in plugin call order, each marked with the
        plugin that registered it."""
        return [attrs.evolve(item, plugin=impl.plugin_name)  # checked when the plugin loaded (registry.returns)
                for impl in _implementations(self._pm.hook.rpx_register_op_formulas) for item in impl.function() or ()]

    # -- stage hooks ---------------------------------------------------------------------------------------------------

    def call_stage(self, stage: Stage, ctx: Any, *, after: str | None = None) -> tuple[Any, str | None]:
        """Ask plugins in call order to run ``stage`` (those after plugin ``after``, when given: see
        :func:`call_next`); return the first non-None result and the plugin that produced it (recorded with the
        result, so every figure names its source). An implementation that raises is re-raised as StageHookError
        naming its plugin."""
        trace = os.environ.get(TRACE_ENV) == "1"
        implementations = _implementations(getattr(self._pm.hook, stage.hook))
        if after is not None:
            names = [impl.plugin_name for impl in implementations]
            implementations = implementations[names.index(after) + 1:] if after in names else []
        for impl in implementations:
            answering = _ANSWERING.set((stage, impl.plugin_name))
            try:
                result = impl.function(**{name: ctx for name in impl.argnames})
            except StageHookError:
                raise  # a later plugin asked through call_next: it names itself
            except Exception as exc:
                if trace:
                    print(f"rpx: hook {stage.hook} [{impl.plugin_name}] raised {type(exc).__name__}", file=sys.stderr)
                raise StageHookError(impl.plugin_name, exc) from exc
            finally:
                _ANSWERING.reset(answering)
            if trace:
                print(f"rpx: hook {stage.hook} [{impl.plugin_name}] -> {type(result).__name__}", file=sys.stderr)
            if result is not None:
                return result, impl.plugin_name
        return None, None


#: The stage hook this thread is in, and the plugin answering it: where :func:`call_next` continues.
_ANSWERING: contextvars.ContextVar[tuple[Stage, str] | None] = contextvars.ContextVar("rpx_answering", default=None)


def call_next(ctx: Any) -> Any:
    """Inside a stage hook: the answer of the plugins asked after this one, in hook order, or None when none of them
    answers. An override of a built-in stage gets the built-in result this way and adjusts a figure of it (its
    plugin stays the stage's ``provided_by``: the figures are its answer)."""
    answering = _ANSWERING.get()
    if answering is None:
        raise RpxError("call_next(ctx) is for a stage hook's body: no stage hook is being answered here")
    stage, plugin = answering
    return ctx.plugins.call_stage(stage, ctx, after=plugin)[0]


def code_location(plugin: Any) -> Path | None:
    """The file a plugin's code is in, or the folder of the top-level package it belongs to (a plugin module in a
    package runs the package's other modules too); None for code not in a file."""
    code = plugin if inspect.ismodule(plugin) or inspect.isclass(plugin) else type(plugin)
    module = code if inspect.ismodule(code) else inspect.getmodule(code)
    if module is None or not getattr(module, "__file__", None):
        return None
    top = sys.modules.get(module.__name__.partition(".")[0])
    if top is not None and top is not module and getattr(top, "__file__", None) and hasattr(top, "__path__"):
        return Path(top.__file__).parent
    return Path(module.__file__).parent if hasattr(module, "__path__") else Path(module.__file__)


def _implementations(hook: Any) -> list[Any]:
    """A hook's implementations in pluggy's call order (tryfirst first, trylast last, otherwise last registered first).

    rpx calls them one by one to know which plugin produced each result; wrappers have nothing to wrap here, so a
    wrapper implementation makes its plugin invalid."""
    return list(reversed(hook.get_hookimpls())) if hook is not None else []


def _argument_problem(plugin: str, hook: str, function: Any, expected: tuple[str, ...]) -> str | None:
    """A hook implementation may take any of its hook's arguments, by name, and nothing else."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return None
    names = tuple(name for name, parameter in parameters.items() if parameter.default is inspect.Parameter.empty
                  and parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD))
    unknown = [name for name in names if name not in expected]
    if unknown:
        wanted = ", ".join(expected) or "no arguments"
        return f"plugin {plugin!r}: {hook}({', '.join(names)}) takes {', '.join(map(repr, unknown))}; {hook} passes: {wanted}"
    return None

