"""The one cattrs converter for specs and results, the error formatting that turns its failures into one line each,
and the validators every concept shares (batch sizes and tensor dimensions; precisions are the ``PrecisionName``
type of :mod:`rpx_core.precision`, durations :func:`rpx_core.spec.limits.seconds_validator`).

Every structured error names the key path the user wrote (``models[0].inputs[1].shape``) and, for unknown keys, suggests
the closest valid name. Every problem of a table is reported at once: a wrong type in one field does not hide a value
another field's validator refuses (see :func:`_every_problem`), so four mistakes take one ``rpx validate``, not four.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Mapping
from typing import Any, Callable

import attrs
import cattrs
from cattrs.errors import (
    AttributeValidationNote,
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
    IterableValidationNote,
)

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
    converter.register_structure_hook(int, _strict_int)
    converter.register_structure_hook(float, _finite_float)
    converter.register_structure_hook_factory(attrs.has, lambda cls: _reporting_every_problem(cls, converter))
    return converter


def _reporting_every_problem(cls: type, converter: cattrs.Converter) -> Callable[[Any, type], Any]:
    """cattrs' generated structure function for ``cls`` (fast, for the valid data results files hold), and when it
    fails, :func:`_every_problem` to find all that is wrong, not only the first refused value."""
    fast = cattrs.gen.make_dict_structure_fn(cls, converter)

    def structure(data: Any, type_: type) -> Any:
        if not isinstance(data, Mapping):
            raise TypeError(f"expected a table, got {type(data).__name__} {data!r}")
        try:
            return fast(data, type_)
        except (cattrs.BaseValidationError, ValueError, TypeError) as error:
            raise _every_problem(cls, data, converter) or error from None

    return structure


def _every_problem(cls: type, data: Mapping[str, Any], converter: cattrs.Converter) -> Exception | None:
    """Every problem of ``data`` as ``cls``: unknown keys, missing keys, values of the wrong type, and what each field's
    validator refuses among the values that structured, each noted with its field so its line carries the key path.

    attrs runs validators in ``__init__``, one after another, and cattrs reports what ``__init__`` raises without the
    field; here every validator runs, each on its own field."""
    fields = [field for field in attrs.fields(attrs.resolve_types(cls)) if field.init]
    errors: list[Exception] = []
    unknown = set(data) - {field.alias for field in fields}
    if unknown:
        errors.append(ForbiddenExtraKeysError("", cls, unknown))
    values: dict[str, Any] = {}
    unstructured: set[str] = set()  # given, but refused: their defaults are not what the user wrote
    for field in fields:
        if field.alias not in data:
            if field.default is attrs.NOTHING:
                errors.append(_noted(KeyError(field.alias), field))
            continue
        try:
            values[field.alias] = converter.structure(data[field.alias], field.type)
        except Exception as exc:  # noqa: BLE001 - every kind of structuring failure is a line to report
            errors.append(_noted(exc, field))
            unstructured.add(field.alias)
    given = {**_defaults(fields), **values}  # a default is validated too, as attrs does
    instance = types.SimpleNamespace(**given)  # what a validator reading other fields sees
    for field in fields:
        if field.validator is None or field.alias not in given or field.alias in unstructured:
            continue
        try:
            field.validator(instance, field, given[field.alias])
        except (ValueError, TypeError, cattrs.BaseValidationError) as exc:
            errors.append(_noted(_without_field_name(exc, field), field))
    if not errors:
        try:
            cls(**values)
        except (ValueError, TypeError) as exc:  # a check across fields (__attrs_post_init__)
            errors.append(exc)
    return ClassValidationError(f"While structuring {cls.__name__}", errors, cls) if errors else None


def _defaults(fields: list[attrs.Attribute]) -> dict[str, Any]:
    found = {}
    for field in fields:
        if isinstance(field.default, attrs.Factory) and not field.default.takes_self:  # type: ignore[arg-type]
            found[field.alias] = field.default.factory()
        elif field.default is not attrs.NOTHING and not isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
            found[field.alias] = field.default
    return found


def _noted(exc: Exception, field: attrs.Attribute) -> Exception:
    note = AttributeValidationNote(f"Structuring @ attribute {field.name}", field.alias, field.type)
    exc.__notes__ = [*getattr(exc, "__notes__", []), note]
    return exc


def _without_field_name(exc: Exception, field: attrs.Attribute) -> Exception:
    """A validator's message without the field's name in front (attrs words its own "'top_k' must be >= 1: 0"):
    the key path already names it."""
    if isinstance(exc, cattrs.BaseValidationError) or not exc.args or not isinstance(exc.args[0], str):
        return exc
    message = exc.args[0]
    for prefix in (f"'{field.name}' ", f"{field.name}: ", f"{field.name} "):
        if message.startswith(prefix):
            message = message.removeprefix(prefix)
            break
    try:
        return type(exc)(message)
    except TypeError:  # an exception class built differently
        return ValueError(message)


# ------------------------------------------------------------------------------------------------ shared validators

#: The largest batch size, sequence length or tensor dimension rpx accepts: what 32-bit index arithmetic in the
#: frameworks' kernels holds. Anything larger is a typo (and beyond 2**63 no framework can even represent it).
MAX_DIMENSION = 2**31 - 1


def dimension_problem(value: int) -> str | None:
    """Why ``value`` is no batch size, sequence length or tensor dimension; None when it is one."""
    if value < 1:
        return f"must be at least 1 (a zero dimension runs no work), got {value}"
    if value > MAX_DIMENSION:
        return f"must be at most {MAX_DIMENSION} (2**31 - 1), got {value}"
    return None


def each(problem: Callable[[Any], str | None], *, at_least_one: str | None = None) -> Callable[[Any, Any, Any], None]:
    """An attrs validator of a list field that checks every item with ``problem`` and reports each refused item
    with its index (``batch_sizes[2]: ...``); ``at_least_one`` is the message for an empty list, when one is needed."""

    def check(_: Any, attribute: attrs.Attribute, values: Any) -> None:
        if values is None:
            return
        if at_least_one is not None and not values:
            raise ValueError(at_least_one)
        errors = []
        for index, value in enumerate(values):
            found = problem(value)
            if found:
                error = ValueError(found)
                error.__notes__ = [IterableValidationNote(f"Validating @ index {index}", index, int)]
                errors.append(error)
        if errors:
            raise IterableValidationError(f"While validating {attribute.name}", errors, tuple)

    return check


def one(problem: Callable[[Any], str | None]) -> Callable[[Any, Any, Any], None]:
    """An attrs validator of one value (None allowed) from a ``problem`` function shared with :func:`each`."""

    def check(_: Any, attribute: attrs.Attribute, value: Any) -> None:
        found = None if value is None else problem(value)
        if found:
            raise ValueError(found)

    return check


def one_of(*choices: str, absent: str | None = None) -> Callable[[Any, Any, Any], None]:
    """An attrs validator of a named choice, in one readable line with "did you mean" (attrs' own ``in_`` repeats
    the whole attribute); ``absent`` allows None and says what None means."""

    def check(_: Any, attribute: attrs.Attribute, value: Any) -> None:
        if value in choices or (value is None and absent is not None):
            return
        also = f" or absent ({absent})" if absent is not None else ""
        hint = did_you_mean(value, choices) if isinstance(value, str) else ""
        raise ValueError(f"{attribute.name} must be one of {', '.join(map(repr, choices))}{also}; got {value!r}{hint}")

    return check


#: A batch size (``count_flops``' ``batch_size``, ``batch_search``'s ``max_batch``).
batch_size = one(dimension_problem)
#: The spec's ``batch_sizes``, a sweep's ``batch_size``, ``seq_len`` and ``resolution``.
batch_sizes = each(dimension_problem)
#: A tensor's shape: every dimension at least 1 (a zero dimension runs no work) and at most MAX_DIMENSION.
shape = each(dimension_problem, at_least_one="a shape needs at least one dimension")


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


def _strict_int(value: Any, _: type) -> int:
    """An integer only: ``"3"``, ``3.7`` and ``true`` are mistakes, not integers to convert."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {type(value).__name__} {value!r}")
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


def _reformat(line: str, base_path: str) -> str:
    message, _, path = line.rpartition(" @ ")
    path = path.removeprefix("$").lstrip(".")
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
        return exc.args[0]
    if typing.get_origin(type_) in (dict, Mapping) or type_ is dict:
        return "expected a table"
    type_name = getattr(type_, "__name__", None) or str(type_).replace("typing.", "")
    return f"invalid value, expected {type_name}"


def _unknown_key_message(key: str, valid: list[str]) -> str:
    hint = did_you_mean(key, valid) or f"; valid keys: {', '.join(valid)}"
    return f"unknown key {key!r}{hint}"
