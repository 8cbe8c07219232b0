"""Loading plugins and every call into them, behind typed methods (the rest of rpx never touches ``pm.hook``).

Built-in plugins (``BUILTIN``, modules of rpx_plugins) and third-party ones (entry-point group ``rpx``) load the same way, so both
are listed and disabled alike. A third-party plugin that fails to import is a warning (an error with ``strict``); a
misspelled hook is always an error; two plugins registering the same name is an error naming both.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import os
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, TypeVar

import attrs
import pluggy

from rpx_core import __version__, hookspecs
from rpx_core.errors import BackendUnavailable, PluginError, RpxError, did_you_mean
from rpx_core.results import PluginInfo

if TYPE_CHECKING:
    from rpx_core.backends import Backend
    from rpx_core.gpus import GPUCatalog
    from rpx_core.spec import Choices
    from rpx_core.stages import StageDef

ENTRY_POINT_GROUP = "rpx"
DISABLE_ENV = "RPX_DISABLE_PLUGINS"  # comma-separated plugin names
STRICT_ENV = "RPX_STRICT_PLUGINS"  # "1": a plugin that fails to import is an error
GPU_PACKS_ENV = "RPX_GPU_PACKS"  # extra GPU pack TOML files, separated like PATH
TRACE_ENV = "RPX_TRACE_HOOKS"  # "1": print every hook call and the plugin that answered to stderr
HOOK_NAMES = frozenset(name for name in dir(hookspecs) if name.startswith("rpx_"))

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
}

T = TypeVar("T")


class PluginLoadWarning(UserWarning):
    """A third-party plugin could not be imported; rpx runs without it."""


def disabled_from_env() -> set[str]:
    return {name.strip() for name in os.environ.get(DISABLE_ENV, "").split(",") if name.strip()}


class Plugins:
    """The loaded plugin set of one rpx process."""

    def __init__(self, manager: pluggy.PluginManager, infos: list[PluginInfo]) -> None:
        self._pm = manager
        self._infos = infos

    # -- loading -------------------------------------------------------------------------------------------------------

    @classmethod
    def load(cls, disabled: Iterable[str] = (), *, strict: bool | None = None, entry_points: bool = True) -> Plugins:
        """Register built-in plugins, then entry-point plugins, skipping ``disabled`` (plus ``RPX_DISABLE_PLUGINS``)."""
        disabled = set(disabled) | disabled_from_env()
        strict = os.environ.get(STRICT_ENV) == "1" if strict is None else strict
        manager = pluggy.PluginManager(hookspecs.PROJECT)
        manager.add_hookspecs(hookspecs)
        plugins = cls(manager, [])
        for name, module_name in BUILTIN.items():
            if name in disabled:
                plugins._infos.append(PluginInfo(name, "rpx", __version__, True, "disabled"))
            else:
                plugins._register(importlib.import_module(module_name), name, "rpx", __version__, builtin=True)
        if entry_points:
            for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
                plugins._load_entry_point(entry_point, disabled, strict)
        unknown = disabled - {info.name for info in plugins._infos}
        if unknown:
            warnings.warn(f"cannot disable unknown plugin(s): {', '.join(sorted(unknown))}", PluginLoadWarning, stacklevel=2)
        try:
            manager.check_pending()
        except pluggy.PluginValidationError as exc:
            raise PluginError(f"plugin {manager.get_name(exc.plugin)!r}: {exc}") from None
        return plugins

    def _load_entry_point(self, entry_point: importlib.metadata.EntryPoint, disabled: set[str], strict: bool) -> None:
        dist = entry_point.dist
        dist_name, version = (dist.metadata["Name"], dist.version) if dist else ("unknown", "unknown")
        if entry_point.name in disabled:
            self._infos.append(PluginInfo(entry_point.name, dist_name, version, False, "disabled"))
            return
        if self._pm.has_plugin(entry_point.name):
            raise PluginError(
                f"plugin name {entry_point.name!r} from {dist_name} {version} is already taken by "
                f"{self._provider(entry_point.name)}"
            )
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
        _check_hook_names(plugin, name)
        try:
            self._pm.register(plugin, name=name)
        except (pluggy.PluginValidationError, ValueError) as exc:
            raise PluginError(f"plugin {name!r} ({dist_name} {version}): {exc}") from None
        hooks = tuple(sorted(impl.name for impl in self._pm.get_hookcallers(plugin) or ()))
        self._infos.append(PluginInfo(name, dist_name, version, builtin, "loaded", hooks))

    def register(self, plugin: Any, name: str) -> None:
        """Register a plugin object at run time (notebooks, tests); it is asked before the built-ins."""
        self._register(plugin, name, "<runtime>", "-", builtin=False)
        try:
            self._pm.check_pending()
        except pluggy.PluginValidationError as exc:
            self.unregister(name)
            raise PluginError(f"plugin {name!r}: {exc}") from None

    def unregister(self, name: str) -> None:
        self._pm.unregister(name=name)
        self._infos = [info for info in self._infos if info.name != name]

    # -- introspection -------------------------------------------------------------------------------------------------

    def infos(self) -> list[PluginInfo]:
        return list(self._infos)

    def _provider(self, plugin_name: str) -> str:
        return f"plugin {plugin_name!r} ({self._distribution(plugin_name)})"

    def _distribution(self, plugin_name: str) -> str:
        info = next(info for info in self._infos if info.name == plugin_name)
        return f"{info.distribution} {info.version}"

    # -- registrations -------------------------------------------------------------------------------------------------

    def _collect(self, hook: str, key: Callable[[T], str], kind: str, chosen: dict[str, str]) -> dict[str, tuple[T, str]]:
        """Call a registration hook plugin by plugin; return name -> (object, plugin name). A name registered more
        than once needs the spec's ``choose`` to pick a provider; a choice naming a plugin that does not register
        that name is refused too."""
        candidates: dict[str, list[tuple[T, str]]] = {}
        for impl in _implementations(getattr(self._pm.hook, hook)):
            for item in impl.function() or ():
                candidates.setdefault(key(item), []).append((item, impl.plugin_name))
        for name, pick in chosen.items():
            providers = [plugin for _, plugin in candidates.get(name, [])]
            if pick not in providers:
                raise PluginError(f"choose.{kind}s: {name!r} = {pick!r}, but {kind} {name!r} is registered by "
                                  f"{', '.join(map(repr, providers)) or 'no plugin'}")
        found: dict[str, tuple[T, str]] = {}
        for name, options in candidates.items():
            if len(options) > 1 and name not in chosen:
                (_, first), (_, second) = options[:2]
                raise PluginError(
                    f"{kind} {name!r} is registered by {self._provider(first)} and by {self._provider(second)}; "
                    f'choose one in the spec, e.g. choose = {{ {kind}s = {{ "{name}" = "{first}" }} }}'
                )
            found[name] = next(option for option in options if option[1] == chosen.get(name, option[1]))
        return found

    def backends(self, choose: Choices | None = None) -> dict[str, Backend]:
        chosen = choose.backends if choose else {}
        return {name: item for name, (item, _) in self._collect("rpx_register_backends", lambda b: b.name, "backend", chosen).items()}

    def backend(self, name: str, choose: Choices | None = None, *, require_available: bool = True) -> Backend:
        """The named backend; an unknown name or an unavailable backend is one clear error."""
        backends = self.backends(choose)
        if name not in backends:
            raise RpxError(f"backend {name!r} not recognized. {choose_one_of(name, backends)}")
        backend = backends[name]
        if require_available and not backend.availability.available:
            raise BackendUnavailable(f"backend {name!r} is not available on this machine: {backend.availability.reason}")
        return backend

    def stages(self, choose: Choices | None = None) -> dict[str, StageDef]:
        chosen = choose.stages if choose else {}
        found = self._collect("rpx_register_stages", lambda s: s.name, "stage", chosen)
        return {name: attrs.evolve(item, plugin=plugin) for name, (item, plugin) in found.items()}

    def gpu_catalog(self, extra_packs: Iterable[Path] = (), choose: Choices | None = None) -> GPUCatalog:
        """Every GPU from plugin packs, the user's pack files and ``RPX_GPU_PACKS``; clashing names need ``[choose.gpus]``."""
        from rpx_core.gpus import GPUCatalog, load_pack

        packs = []
        for impl in _implementations(self._pm.hook.rpx_register_gpu_packs):
            for path in impl.function() or ():
                path = Path(path) if isinstance(path, str) else path  # Path or importlib.resources Traversable
                packs.append(load_pack(path, provider=self._distribution(impl.plugin_name)))
        from_env = [Path(path) for path in os.environ.get(GPU_PACKS_ENV, "").split(os.pathsep) if path]
        packs.extend(load_pack(Path(path), provider=str(path)) for path in [*extra_packs, *from_env])
        return GPUCatalog(packs, choose=choose.gpus if choose else {})

    # -- stage hooks ---------------------------------------------------------------------------------------------------

    def call_stage_hook(self, stage: str, ctx: Any) -> tuple[Any, str | None]:
        """Ask plugins (third-party first, built-ins last) to run ``stage``; return the first non-None result and
        the name of the plugin that produced it (recorded with the result, so every figure names its source)."""
        trace = os.environ.get(TRACE_ENV) == "1"
        for impl in _implementations(getattr(self._pm.hook, f"rpx_{stage}")):
            result = impl.function(**{name: ctx for name in impl.argnames})
            if trace:
                print(f"rpx: hook rpx_{stage} [{impl.plugin_name}] -> {type(result).__name__}", file=sys.stderr)
            if result is not None:
                return result, impl.plugin_name
        return None, None


def _implementations(hook: Any) -> list[Any]:
    """A hook's implementations in pluggy's call order (tryfirst first, trylast last, otherwise last registered first).

    rpx calls them one by one to know which plugin produced each result; wrappers have nothing to wrap here, so a
    wrapper implementation is refused when the plugin registers (see ``_check_hook_names``)."""
    return list(reversed(hook.get_hookimpls()))


def choose_one_of(name: str, valid: Iterable[str]) -> str:
    valid = sorted(valid)
    close = difflib.get_close_matches(name, valid, n=3)
    ordered = close + [v for v in valid if v not in close]
    return f"Choose one of: {', '.join(ordered)}" if ordered else "None is registered."


def _check_hook_names(plugin: Any, name: str) -> None:
    """A function named like a hook that is not one is a typo that would be silently ignored: refuse it. Hook
    wrappers are refused too: rpx calls implementations one by one, so there is no call for them to wrap."""
    for attribute in dir(plugin):
        options = getattr(getattr(plugin, attribute, None), f"{hookspecs.PROJECT}_impl", None)
        if options and (options.get("wrapper") or options.get("hookwrapper")):
            raise PluginError(f"plugin {name!r}: {attribute!r} is a hook wrapper, which rpx does not support")
        if attribute.startswith("rpx_") and attribute not in HOOK_NAMES and callable(getattr(plugin, attribute)):
            raise PluginError(f"plugin {name!r}: {attribute!r} is not an rpx hook{did_you_mean(attribute, HOOK_NAMES)}")
