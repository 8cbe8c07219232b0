"""A Hugging Face configuration's attributes and their types, read from source without importing anything.

``rpx validate`` checks a spec's ``config`` overrides of an ``hf:`` model (a misspelt key, a string where a number
belongs) in rpx's own process, which must import neither transformers (seconds) nor the model folder's own code
(never run unless ``trust_remote_code`` is true). So the configuration class is found in transformers' source files
(by the ``model_type`` of the model's ``config.json``) or in the folder's own configuration file (named by its
``auto_map``), and parsed with :mod:`ast`: its annotated fields (transformers 5's dataclass configurations), its
``__init__`` parameters and ``self.x = ...`` assignments (transformers 4), its properties and ``attribute_map``, and
those of its base classes. When any of it cannot be read, only what was read is checked: a key is never refused
because a source file could not be followed.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from rpx_core.plugin import did_you_mean

#: Bases that carry no configuration attributes; a class deriving from one of these is complete when read.
ROOTS = {"object", "PreTrainedConfig", "PretrainedConfig"}


@attrs.frozen
class ConfigFields:
    """What a configuration class accepts: attribute -> the Python types a value may have (None: any), and whether
    every base class was read (else unknown keys cannot be refused)."""

    class_name: str
    types: dict[str, tuple[type, ...] | None]
    complete: bool


def config_fields(config: Mapping[str, Any], folder: Path | None) -> ConfigFields | None:
    """The fields of the class ``config`` (a ``config.json``) is loaded as: the folder's own class when its
    ``auto_map`` names one, else transformers' class for its ``model_type``; None when neither can be found."""
    auto = (config.get("auto_map") or {}).get("AutoConfig") if isinstance(config.get("auto_map"), dict) else None
    if isinstance(auto, str) and folder is not None and "--" not in auto:
        module, _, name = auto.rpartition(".")
        found = _read_class(folder / f"{module.replace('.', '/')}.py", name, depth=0)
        if found is not None:
            return found
    model_type = config.get("model_type")
    path = transformers_config_file(model_type) if isinstance(model_type, str) else None
    if path is None:
        return None
    name = _class_with_model_type(ast.parse(path.read_bytes()), model_type)
    return _read_class(path, name, depth=0) if name else None


def transformers_config_file(model_type: str) -> Path | None:
    """transformers' configuration module for ``model_type`` (found on the import path, not imported), or None."""
    try:
        spec = importlib.util.find_spec("transformers")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    models = Path(next(iter(spec.submodule_search_locations))) / "models"
    module = model_type.replace("-", "_")
    path = models / module / f"configuration_{module}.py"
    if path.is_file():
        return path
    needle = f'model_type = "{model_type}"'
    return next((path for path in sorted(models.glob("*/configuration_*.py")) if needle in path.read_text(errors="replace")),
                None)


def _class_with_model_type(tree: ast.Module, model_type: str) -> str | None:
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for statement in node.body:
                if (isinstance(statement, ast.Assign) and any(_is_name(t, "model_type") for t in statement.targets)
                        and isinstance(statement.value, ast.Constant) and statement.value.value == model_type):
                    return node.name
    return None


def _read_class(path: Path, name: str, depth: int) -> ConfigFields | None:
    """The fields class ``name`` of the file at ``path`` declares, its bases' included."""
    try:
        tree = ast.parse(path.read_bytes())
    except (OSError, SyntaxError, ValueError):
        return None
    node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
    if node is None or depth > 8:
        return None
    types: dict[str, tuple[type, ...] | None] = {}
    complete = True
    for base in node.bases:
        base_name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else None
        found = None if base_name is None else _read_base(path, tree, base_name, depth)
        if found is not None:
            types.update(found.types)
            complete = complete and found.complete
        elif base_name not in ROOTS and not (base_name or "").endswith("Mixin"):
            complete = False
    types.update(_own_fields(node))
    return ConfigFields(name, types, complete)


def _read_base(path: Path, tree: ast.Module, name: str, depth: int) -> ConfigFields | None:
    """A base class, in the same file or in the module the file imports it from (relative imports followed)."""
    if any(isinstance(n, ast.ClassDef) and n.name == name for n in tree.body):
        return _read_class(path, name, depth + 1)
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and any(alias.name == name for alias in node.names) and node.level:
            folder = path.parent
            for _ in range(node.level - 1):
                folder = folder.parent
            target = folder.joinpath(*(node.module or "").split("."))
            file = target.with_suffix(".py") if target.with_suffix(".py").is_file() else target / "__init__.py"
            return _read_class(file, name, depth + 1)
    return None


def _own_fields(node: ast.ClassDef) -> dict[str, tuple[type, ...] | None]:
    fields: dict[str, tuple[type, ...] | None] = {}
    for statement in node.body:
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            if "ClassVar" not in ast.unparse(statement.annotation):
                fields[statement.target.id] = annotation_types(statement.annotation)
        elif isinstance(statement, ast.Assign) and any(_is_name(t, "attribute_map") for t in statement.targets):
            if isinstance(statement.value, ast.Dict):
                fields.update({key.value: None for key in statement.value.keys
                               if isinstance(key, ast.Constant) and isinstance(key.value, str)})
        elif isinstance(statement, ast.FunctionDef):
            if any(_is_name(d, "property") or (isinstance(d, ast.Attribute) and d.attr == "setter")
                   for d in statement.decorator_list):
                fields.setdefault(statement.name, None)
            if statement.name == "__init__":
                fields.update({k: v for k, v in _init_fields(statement).items() if k not in fields})
    return fields


def _init_fields(init: ast.FunctionDef) -> dict[str, tuple[type, ...] | None]:
    """transformers 4: the parameters of ``__init__`` (typed by their default) and every ``self.x = ...``."""
    args = init.args.args[1:]
    defaults = [None] * (len(args) - len(init.args.defaults)) + list(init.args.defaults)
    fields = {arg.arg: _default_types(default) for arg, default in zip(args, defaults)}
    fields.update({arg.arg: _default_types(default) for arg, default in zip(init.args.kwonlyargs, init.args.kw_defaults)})
    for node in ast.walk(init):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _is_name(node.value, "self"):
            fields.setdefault(node.attr, None)
    return fields


def _default_types(default: ast.expr | None) -> tuple[type, ...] | None:
    if isinstance(default, ast.Constant) and default.value is not None:
        kind = type(default.value)
        return (float, int) if kind is float else (kind,)
    return None


_NAMES: dict[str, tuple[type, ...]] = {"int": (int,), "float": (float, int), "str": (str,), "bool": (bool,),
                                        "list": (list,), "tuple": (list,), "dict": (dict,), "None": (type(None),)}


def annotation_types(annotation: ast.expr) -> tuple[type, ...] | None:
    """The TOML-readable Python types an annotation admits (``int | None`` -> int, NoneType); None when it admits
    something this cannot name (a class, ``Any``), so any value is let through."""
    if isinstance(annotation, ast.Constant) and annotation.value is None:
        return (type(None),)
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):  # a string annotation
        try:
            return annotation_types(ast.parse(annotation.value, mode="eval").body)
        except SyntaxError:
            return None
    if isinstance(annotation, ast.Name):
        return _NAMES.get(annotation.id)
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        left, right = annotation_types(annotation.left), annotation_types(annotation.right)
        return None if left is None or right is None else left + right
    if isinstance(annotation, ast.Subscript):
        outer = annotation.value.id if isinstance(annotation.value, ast.Name) else None
        inner = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
        if outer in ("Optional", "Union"):
            members = [annotation_types(member) for member in inner]
            found = None if any(m is None for m in members) else sum(members, ())  # type: ignore[arg-type]
            return found + ((type(None),) if outer == "Optional" and found is not None else ())
        if outer == "Literal":
            return tuple({type(member.value) for member in inner if isinstance(member, ast.Constant)}) or None
        return _NAMES.get(outer or "")
    return None


def _is_name(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def override_problems(overrides: Mapping[str, Any], fields: ConfigFields | None,
                      known: Mapping[str, Any]) -> list[str]:
    """``config.<key>: problem`` for each override the configuration does not have or whose value has the wrong type;
    ``known`` is the ``config.json`` as read (a key in it is accepted, typed by its value when the class says
    nothing)."""
    types = dict(fields.types) if fields is not None else {}
    for key, value in known.items():
        types.setdefault(key, _value_types(value))
    problems = []
    for key, value in overrides.items():
        if key not in types:
            if fields is not None and fields.complete:
                problems.append(f"config.{key}: {fields.class_name} has no attribute {key!r}{did_you_mean(key, types)}")
            continue
        wanted = types[key]
        if wanted is not None and not (type(value) in wanted or (isinstance(value, int) and not isinstance(value, bool)
                                                                  and float in wanted)):
            names = " or ".join(dict.fromkeys("null" if kind is type(None) else kind.__name__ for kind in wanted))
            problems.append(f"config.{key}: expected {names}, got {type(value).__name__} {value!r}")
    return problems


def _value_types(value: Any) -> tuple[type, ...] | None:
    """What may replace a ``config.json`` value the class says nothing about: a number any number, else its kind."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (float, int)
    return (type(value),)
