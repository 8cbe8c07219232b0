"""Model sources: models named by a scheme (``hf:meta-llama/Llama-2-7b-hf``, ``torchvision:resnet50``) instead of an
import path, built by the plugin that registers the scheme.

A source is a registration object returned by a plugin's ``rpx_register_model_sources`` hook. A spec's ``source``
whose part before the first ``:`` is a registered scheme goes through that source (so a registered scheme shadows a
top-level module of the same name); anything else is an import path (``pkg.module:callable`` or
``file.py:callable``). Everything here runs in rpx's own process at validate time, so it never imports the library a
source builds with: it finds it on the import path and says how to install it when it is missing.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import cattrs

from rpx_core.errors import PluginError, RpxError, UnsupportedError, closest

if TYPE_CHECKING:
    from rpx_core.spec.schema import InputSpec, ModelSpec

SCHEME = re.compile(r"[a-z][a-z0-9_-]*")

#: ``build(target, config, **kwargs)`` -> the model; ``target`` is the source after the scheme, ``config`` the spec's
#: configuration overrides, ``kwargs`` the model's ``kwargs``.
Build = Callable[..., Any]
#: ``inputs(target, shape, config)`` -> the model's inputs for an ``input_shape`` (cheap: no heavy import).
Inputs = Callable[[str, tuple[int, ...], Mapping[str, Any]], "tuple[InputSpec, ...]"]
#: ``check(target, config)`` -> problems with the name, found without importing the library (e.g. a missing folder).
Check = Callable[[str, Mapping[str, Any]], "list[str]"]


def _scheme(_: Any, attribute: attrs.Attribute, value: str) -> None:
    if not SCHEME.fullmatch(value):
        raise ValueError(f"model source scheme {value!r} must be lower-case letters, digits, '-' or '_', "
                         "starting with a letter")


def _no_check(target: str, config: Mapping[str, Any]) -> list[str]:
    return []


@attrs.frozen
class ModelSource:
    """How models named ``<scheme>:<target>`` are built and fed.

    * ``build``: called in the worker with the target, the spec's ``config`` overrides and the model's ``kwargs``;
      under the meta device for counted stages, so it must create parameters the ordinary way (no weights loaded).
    * ``inputs``: the model's inputs for an ``input_shape`` (e.g. token ids of batch x sequence).
    * ``requires``: top-level modules ``build`` imports; ``rpx validate`` finds them without importing them.
    * ``install``: how to get them, for the message when one is missing.
    * ``check``: further problems with a target that can be seen before anything runs, one line each; a line that
      starts with ``config.`` or ``kwargs.`` is about that key of the model, any other about its ``source``.
    * ``kwargs``: an attrs class the model's ``kwargs`` table is structured into before anything runs (unknown keys
      and wrong types are lines with their key path); None: ``build`` takes any keyword arguments.
    * ``example``: a target, for ``rpx plugins`` and messages.
    """

    scheme: str = attrs.field(validator=_scheme)
    description: str
    build: Build
    inputs: Inputs
    requires: tuple[str, ...] = ()
    install: str = ""
    check: Check = _no_check
    kwargs: type | None = None
    example: str = ""

    def missing(self) -> list[str]:
        """Required modules that cannot be found on the import path (found, never imported)."""
        return [name for name in self.requires if not findable(name)]

    def missing_message(self) -> str | None:
        missing = self.missing()
        if not missing:
            return None
        how = f": {self.install}" if self.install else ""
        return f"model source {self.scheme!r} needs {', '.join(map(repr, missing))}, which is not installed{how}"


def findable(module: str) -> bool:
    """Whether ``module`` is on the import path, found without importing it (a plugin's library, checked before
    anything runs; a module set to None in ``sys.modules`` cannot be imported, so is not found)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def split(source: str, schemes: Any) -> tuple[str, str] | None:
    """``(scheme, target)`` when ``source`` names a registered scheme, else None (an import path)."""
    scheme, colon, target = source.partition(":")
    if colon and scheme in schemes:
        return scheme, target
    return None


def source_of(source: str, registry: Any) -> tuple[ModelSource, str] | None:
    """The registered source and target of ``source``, or None for an import path."""
    parts = split(source, registry)
    if parts is None:
        return None
    return registry[parts[0]], parts[1]


def problems(model: ModelSpec, registry: Any) -> list[str]:
    """What is wrong with a model's named source, as ``key: problem`` lines (empty for import paths, which
    :func:`rpx_core.spec.checks.import_path_problem` checks)."""
    try:
        found = source_of(model.source, registry)
    except PluginError as exc:
        return [f"source: {exc}"]
    if found is None:
        return ["config: only named models (e.g. 'hf:gpt2') take configuration overrides; pass a factory's "
                "arguments as kwargs"] if model.config else []
    source, target = found
    lines = []
    if not target:
        example = f", e.g. '{source.scheme}:{source.example}'" if source.example else ""
        lines.append(f"source: {model.source!r} names no model after '{source.scheme}:'{example}")
    missing = source.missing_message()
    if missing:
        lines.append(f"source: {missing}")
    if target:
        lines.extend(line if line.startswith(("config.", "kwargs.")) else f"source: {line}"
                     for line in source.check(target, model.config))
    return lines + kwargs_problems(model.kwargs, source.kwargs)


def kwargs_problems(kwargs: Mapping[str, Any], options: type | None) -> list[str]:
    """A named model's ``kwargs`` against its source's kwargs class, as ``kwargs.key: problem`` lines."""
    if options is None:
        return []
    from rpx_core.convert import converter, describe_errors

    try:
        converter.structure(dict(kwargs), options)
    except (cattrs.BaseValidationError, ValueError, TypeError) as exc:
        return describe_errors(exc, "kwargs")
    return []


def unknown_scheme_hint(source: str, registry: Any) -> str:
    """For an import path whose module is not found: "; did you mean the model source 'hf:'?" when the part before
    the colon is close to a registered scheme."""
    close = closest(source.partition(":")[0], registry)
    return f"; did you mean the model source '{close[0]}:'?" if close else ""


def factory(model: ModelSpec, registry: Any) -> Callable[[], Any]:
    """A no-argument function building ``model`` (through its source, or its import path with its kwargs)."""
    found = source_of(model.source, registry) if registry is not None else None
    if found is None:
        from rpx_core.loading import load_callable

        build = load_callable(model.source, what=f"model {model.name!r}")  # imported here, built when called
        return lambda: build(**model.kwargs)
    source, target = found
    for module in source.requires:  # imported here too, so a caller can time importing apart from building
        import_or_explain(module, source.scheme, source.install)

    def build_from_source() -> Any:
        return source.build(target, dict(model.config), **model.kwargs)

    return build_from_source


def resolve_target(model: ModelSpec, base_dir: str, registry: Any) -> ModelSpec:
    """A named model's target written as ``./folder`` or ``../folder`` is relative to the spec's folder (as model
    files are): made absolute, so the job means the same from any working directory."""
    parts = split(model.source, registry)
    if parts is None or not parts[1].startswith(("./", "../")):
        return model
    return attrs.evolve(model, source=f"{parts[0]}:{(Path(base_dir) / parts[1]).resolve()}")


def resolve_inputs(model: ModelSpec, registry: Any) -> ModelSpec:
    """``model`` with the inputs its ``input_shape`` stands for: its source's inputs for a named model, one floating
    tensor of that shape for an import path. A model that gives ``inputs`` or an ``input_factory`` is unchanged."""
    from rpx_core.spec.schema import InputSpec

    if model.input_shape is None or model.inputs or model.input_factory:
        return model
    try:
        found = source_of(model.source, registry)
    except PluginError:  # a scheme two plugins register: reported by problems(), with how to choose
        return model
    if found is None:
        inputs: tuple[InputSpec, ...] = (InputSpec(shape=model.input_shape),)
    else:
        source, target = found
        inputs = tuple(source.inputs(target, model.input_shape, model.config))
    return attrs.evolve(model, inputs=inputs)


def import_or_explain(module: str, scheme: str, install: str) -> Any:
    """Import a source's library in the worker; one line saying how to install it, or why it does not import."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module.split(".")[0]:
            raise UnsupportedError(f"model source {scheme!r}: {module} is installed but does not import: {exc}") from exc
        raise UnsupportedError(f"model source {scheme!r} needs {module!r}, which is not installed: {install}") from exc
    except Exception as exc:  # installed but broken, e.g. built for another torch
        raise UnsupportedError(f"model source {scheme!r}: {module} is installed but does not import here "
                               f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                               f"it may be built for another torch version: {install}") from exc


def parse_shape(text: str, what: str = "--input") -> tuple[int, ...]:
    """``"1x2048"`` -> (1, 2048); RpxError naming ``what`` otherwise."""
    parts = text.lower().replace("×", "x").split("x")
    try:
        shape = tuple(int(part) for part in parts)
    except ValueError:
        raise RpxError(f"{what}: {text!r} is not a shape; write dimensions separated by 'x', e.g. 1x128") from None
    from rpx_core.convert import dimension_problem

    problem = next((found for dim in shape if (found := dimension_problem(dim))), None)
    if problem:
        raise RpxError(f"{what}: {text!r}: every dimension {problem}")
    return shape
