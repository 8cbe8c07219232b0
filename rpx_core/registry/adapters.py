"""Model adapters: how a model object as a user has it (a Flax module and its variables, an Equinox module, a
TrainState, ...) becomes the object a backend runs, and which backend that is when the spec or call names none.

An adapter is a registration object returned by a plugin's ``rpx_register_model_adapters`` hook. It names the
framework it feeds (a backend's ``framework``), recognises objects by type (``accepts``, which must be cheap and must
not import a library the object cannot come from) and converts them (``adapt``). The built-in JAX adapters live in
:mod:`rpx_plugins.jax.adapters`; a plugin for another JAX library registers its own the same way, converting to
:class:`JaxModel`, the one form every JAX model takes inside rpx (defined here, importing no jax, so that adapters
anywhere can build it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

import attrs

from rpx_core.errors import RpxError, UnsupportedError

if TYPE_CHECKING:
    from rpx_core.registry.backends import Backend


@attrs.frozen
class ModelAdapter:
    """Recognises one form of model object and converts it for the backends of ``framework``."""

    name: str  # unique, e.g. "flax-linen"
    framework: str  # the Backend.framework it feeds, e.g. "jax"
    form: str  # the accepted form in words, for the message listing every form, e.g. "(linen module, variables)"
    accepts: Callable[[Any], bool]
    adapt: Callable[[Any], Any]  # -> the object the framework's backends place and count


def adapter_for(model: Any, adapters: Iterable[ModelAdapter], framework: str | None = None) -> ModelAdapter | None:
    """The first adapter (of ``framework``, if given) that accepts ``model``."""
    return next((a for a in adapters if (framework is None or a.framework == framework) and a.accepts(model)), None)


def accepted_forms(adapters: Iterable[ModelAdapter], framework: str | None = None) -> str:
    return "; ".join(f"{a.form} [{a.framework}]" for a in adapters if framework is None or a.framework == framework)


def adapt_model(model: Any, adapters: list[ModelAdapter], backend: Backend, what: str) -> Any:
    """``model`` converted for ``backend`` by the first of its framework's adapters that accepts it. A model only
    another framework's adapter recognises is one line naming the framework that runs it; a model no adapter
    recognises is passed on unchanged, for the backend to run or refuse (torch backends run any callable)."""
    adapter = adapter_for(model, adapters, backend.framework)
    if adapter is not None:
        return adapter.adapt(model)
    other = adapter_for(model, adapters)
    if other is not None:
        raise UnsupportedError(
            f"{what} is a {other.form} model, which {other.framework!r} backends run, but backend {backend.name!r} "
            f"runs {backend.framework!r} models: name a {other.framework} backend (`rpx backends`), or none to infer it"
        )
    return model


def infer_backend(model: Any, adapters: list[ModelAdapter], backends: Mapping[str, Backend] | Any, what: str) -> str:
    """The backend for ``model`` when none is named: the first available backend (in registration order) of the
    framework whose adapter accepts it; one line listing every accepted form otherwise."""
    adapter = adapter_for(model, adapters)
    if adapter is None:
        raise UnsupportedError(
            f"cannot tell which backend runs {what} (a {type(model).__module__}.{type(model).__qualname__}); "
            f"accepted forms: {accepted_forms(adapters)}; or name a backend"
        )
    names = list(getattr(backends, "candidates", backends))  # a plugins Registry: in registration order
    fitting = [name for name in names if backends[name].framework == adapter.framework]
    available = [name for name in fitting if backends[name].availability.available]
    if not fitting:
        raise UnsupportedError(f"{what} is a {adapter.form} model, but no backend runs {adapter.framework!r} models")
    return (available or fitting)[0]

def backend_if_known(model: Any, adapters: list[ModelAdapter], backends: Mapping[str, Backend] | Any,
                     what: str) -> str | None:
    """:func:`infer_backend` for a spec that names no backend: None (keep the default) for a model no adapter
    recognises, or one whose framework the backends leave in doubt (a ``[choose]`` entry the plan reports)."""
    if adapter_for(model, adapters) is None:
        return None
    try:
        return infer_backend(model, adapters, backends, what)
    except RpxError:
        return None


# -- the form JAX adapters convert to ---------------------------------------------------------------------------------

#: The role of each params leaf, reported as torch reports parameters and buffers.
TRAINABLE, NON_TRAINABLE, BUFFER = "trainable", "non_trainable", "buffer"


@attrs.frozen
class JaxModel:
    """A JAX model: ``apply(params, *inputs, **named_inputs)`` and its ``params`` pytree.

    ``roles``: one of TRAINABLE, NON_TRAINABLE, BUFFER per leaf of ``params`` (``jax.tree.leaves`` order); None
    makes every leaf trainable. ``optimizer``: ``(params, grads) -> new params``, counted after the gradient when
    ``backward = true`` (grads has ``params``' structure, None at leaves that are not trainable). ``root_scope`` and
    ``ignored_scopes``: the name-stack component naming the model itself and prefixes of components that are not
    module names, dropped from module paths. ``form`` names the form the user gave, for messages.
    """

    apply: Callable[..., Any]
    params: Any
    roles: tuple[str, ...] | None = None
    optimizer: Callable[[Any, Any], Any] | None = None
    root_scope: str | None = None
    ignored_scopes: tuple[str, ...] = ()
    form: str = "JaxModel(apply, params)"

    def leaf_roles(self) -> list[str]:
        import jax

        count = len(jax.tree.leaves(self.params))
        if self.roles is None:
            return [TRAINABLE] * count
        if len(self.roles) != count:
            raise UnsupportedError(f"{self.form}: {len(self.roles)} roles for {count} params leaves")
        return list(self.roles)
