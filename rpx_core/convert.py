"""The one cattrs converter for specs and results, and the error formatting that turns its failures into one line each.

Every structured error names the key path the user wrote (``models[0].inputs[1].shape``) and, for unknown keys, suggests
the closest valid name.
"""

from __future__ import annotations

import math
import types
import typing
from typing import Any, Callable

import attrs
import cattrs
from cattrs.errors import ForbiddenExtraKeysError

from rpx_core.errors import did_you_mean


def make_converter() -> cattrs.Converter:
    """A converter that rejects unknown keys and drops None values (TOML has no null)."""
    converter = cattrs.Converter(forbid_extra_keys=True, omit_if_default=False)
    converter.register_unstructure_hook_factory(attrs.has, _omit_none_factory(converter))
    for item_type, one, many in ((int, "an integer", "integers"), (str, "a string", "strings")):
        converter.register_structure_hook_func(lambda t, i=item_type: t == tuple[i, ...], _strict_tuple(item_type, one, many))
    converter.register_structure_hook_func(_is_scalar_union, _structure_scalar_union)
    converter.register_structure_hook(bool, _strict_bool)
    converter.register_structure_hook(str, _strict_str)
    converter.register_structure_hook(float, _finite_float)
    return converter


def _strict_bool(value: Any, _: type) -> bool:
    """true or false only: ``"false"`` must not silently become True."""
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {type(value).__name__} {value!r}")
    return value


def _strict_str(value: Any, _: type) -> str:
    """A string only: a number where a name or a path belongs is a mistake, not something to convert."""
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__} {value!r}")
    return value


def _finite_float(value: Any, _: type) -> float:
    """A number (an integer is taken as one), never a string, a boolean, nan or inf: TOML writes ``inf`` and
    ``nan``, and a limit of ``inf`` seconds is no limit."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {value}")
    return float(value)


def _strict_tuple(item_type: type, one: str, many: str) -> Callable[[Any, type], tuple]:
    """A list of ``item_type`` only: a bare string is refused rather than split into characters, a boolean is not an
    integer, and nothing is converted silently."""

    def structure(value: Any, _: type) -> tuple:
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"expected a list of {many}, got {type(value).__name__} {value!r}")
        for item in value:
            if isinstance(item, bool) or not isinstance(item, item_type):
                raise TypeError(f"expected {one}, got {item!r}")
        return tuple(value)

    return structure


SCALARS = (bool, int, float, str)


def _is_scalar_union(type_: Any) -> bool:
    args = [arg for arg in typing.get_args(type_) if arg is not type(None)]
    return typing.get_origin(type_) in (typing.Union, types.UnionType) and bool(args) and all(a in SCALARS for a in args)


def _structure_scalar_union(value: Any, type_: Any) -> Any:
    """Keep the value's own type when it is one of the union's members (an int stays an int in ``int | float``)."""
    members = typing.get_args(type_)
    if value is None and type(None) in members:
        return None
    if isinstance(value, bool) and bool not in members:
        raise TypeError(f"expected {' or '.join(m.__name__ for m in members)}, got a boolean")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {value}")
    if type(value) in members:
        return value
    if isinstance(value, int) and float in members:
        return float(value)
    raise TypeError(f"expected {' or '.join(m.__name__ for m in members)}, got {type(value).__name__}")


#: attrs field metadata: how the field's None is written (TOML has no null), for a field whose None is not its
#: default and must survive a round trip (``InputSpec.batch_dim``: ``"none"``, no batch dimension).
NONE_AS = "rpx_none_as"


def _omit_none_factory(converter: cattrs.Converter):
    def factory(cls: type):
        base = cattrs.gen.make_dict_unstructure_fn(cls, converter)
        spelled = {field.name: field.metadata[NONE_AS] for field in attrs.fields(cls) if NONE_AS in field.metadata}

        def unstructure(obj: Any) -> dict[str, Any]:
            return {key: spelled[key] if value is None else value for key, value in base(obj).items()
                    if value is not None or key in spelled}

        return unstructure

    return factory


converter = make_converter()


def structure(data: Any, cls: type, *, where: str, base_path: str = "") -> Any:
    """Structure ``data`` into ``cls``; on failure raise ``error_type`` with one line per problem.

    ``where`` names the source (a file path) and ``base_path`` the key path of ``data`` inside it.
    """
    from rpx_core.errors import SpecError

    try:
        return converter.structure(data, cls)
    except (cattrs.BaseValidationError, ValueError, TypeError) as exc:
        lines = describe_errors(exc, base_path)
        raise SpecError("\n".join(f"{where}: {line}" for line in lines)) from exc


def describe_errors(exc: BaseException, base_path: str = "") -> list[str]:
    """Flatten a cattrs error tree into ``key.path: what is wrong`` lines."""
    if not isinstance(exc, cattrs.BaseValidationError):
        return [f"{base_path or '<top>'}: {exc}"]
    lines = cattrs.transform_error(exc, path="$", format_exception=_format_exception)
    return [_reformat(line, base_path) for line in lines]


#: Separates a message from the attrs field its validator checked, so the field joins the key path.
FIELD_MARK = " @field "


def _reformat(line: str, base_path: str) -> str:
    message, _, path = line.rpartition(" @ ")
    path = path.removeprefix("$").lstrip(".")
    message, _, field = message.partition(FIELD_MARK)
    path = f"{path}.{field}".lstrip(".") if field else path
    if base_path:
        path = f"{base_path}.{path}" if path and not path.startswith("[") else f"{base_path}{path}"
    return f"{path or '<top>'}: {message}"


def _format_exception(exc: BaseException, type_: Any) -> str:
    if isinstance(exc, ForbiddenExtraKeysError):
        valid = [field.name for field in attrs.fields(exc.cl)] if attrs.has(exc.cl) else []
        return "; ".join(_unknown_key_message(key, valid) for key in sorted(exc.extra_fields))
    if isinstance(exc, KeyError):
        return "required key is missing"
    if typing.get_origin(type_) is typing.Literal:
        choices = typing.get_args(type_)
        value = str(exc).partition(" not in literal ")[0]
        hint = did_you_mean(value, [str(choice) for choice in choices]) if " not in literal " in str(exc) else ""
        return f"expected one of {', '.join(map(repr, choices))}" + (f", got {value!r}{hint}" if hint or value else "")
    if isinstance(exc, (ValueError, TypeError)) and exc.args and isinstance(exc.args[0], str):
        if len(exc.args) > 1 and isinstance(exc.args[1], attrs.Attribute):  # an attrs validator: message, attribute
            return f"{exc.args[0]}{FIELD_MARK}{exc.args[1].name}"
        return exc.args[0]
    type_name = getattr(type_, "__name__", None) or str(type_).replace("typing.", "")
    return f"invalid value, expected {type_name}"


def _unknown_key_message(key: str, valid: list[str]) -> str:
    hint = did_you_mean(key, valid) or f"; valid keys: {', '.join(valid)}"
    return f"unknown key {key!r}{hint}"
