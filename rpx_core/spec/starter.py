"""A spec for one model from what a user types (``hf:gpt2``, ``pkg.mod:build``, ``model.py``) and an input shape:
as data (``rpx profile`` runs it in memory) and as a commented TOML file (``rpx init``, ``rpx profile --save-spec``)
that ``rpx validate`` accepts unchanged.

Imports nothing heavy: a model file is read (never run) to find its build function.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path
from typing import Any

import tomli_w

from rpx_core.errors import RpxError
from rpx_core.safe_read import read_bytes
from rpx_core.spec.schema import DEFAULT_STAGES

DEFAULT_MODEL = "rpx_plugins.torch.zoo:tiny_cnn"
#: Functions a model file's build function is looked for under, in order, when the file names none.
BUILD_NAMES = ("build_model", "make_model", "create_model", "get_model", "model")
#: The input shape written when none is given, by how the model is named.
DEFAULT_SHAPES = {"hf": (1, 128), "torchvision": (1, 3, 224, 224), "timm": (1, 3, 224, 224)}
#: What an input shape means, by scheme, for the comment beside it.
SHAPE_MEANING = {"hf": "batch x sequence of token ids", "torchvision": "batch x channels x height x width",
                 "timm": "batch x channels x height x width"}


def model_source(model: str | None) -> str:
    """The spec's ``source`` for what the user typed: a named model or import path as it is, a model file with its
    build function found (``model.py`` -> ``model.py:build_model``)."""
    if not model:
        return DEFAULT_MODEL
    if ":" in model:
        return model
    if model.endswith(".py"):
        return f"{model}:{build_function(Path(model))}"
    raise RpxError(f"model {model!r}: give an import path 'package.module:callable', a file 'model.py' or "
                   f"'model.py:callable', or a named model such as 'hf:{model}' or 'torchvision:{model}'")


def build_function(path: Path) -> str:
    """The function in a model file that builds its model: one of BUILD_NAMES, else its only top-level function."""
    try:
        tree = ast.parse(read_bytes(path))
    except FileNotFoundError:
        raise RpxError(f"model file {str(path)!r}: no such file") from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise RpxError(f"model file {str(path)!r}: cannot read it: {exc}") from None
    functions = [node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))
                 and not node.name.startswith("_")]
    for name in BUILD_NAMES:
        if name in functions:
            return name
    if len(functions) == 1:
        return functions[0]
    listed = f" (it defines {', '.join(functions)})" if functions else " (it defines no function)"
    raise RpxError(f"model file {str(path)!r}: say which function builds the model, as {path}:NAME{listed}")


#: Callables whose name says nothing about the model (``model.py:build``): the model is named for its file instead.
GENERIC_CALLABLES = ("build", *BUILD_NAMES)


def model_name(source: str) -> str:
    """A short name for the model's results: the callable's name, or the file's (module's) when the callable's is
    generic (``my_model.py:build`` -> ``my_model``), or the last part of a named model (``hf:org/gpt2`` -> ``gpt2``)."""
    module, colon, attr = source.rpartition(":")
    if colon and (module.endswith(".py") or "." in module) and attr in GENERIC_CALLABLES:
        last = Path(module).stem if module.endswith(".py") else module.rpartition(".")[2]
    else:
        last = re.split(r"[/:.]", source.rstrip("/"))[-1] or "model"
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", last).strip("-") or "model"


def spec_data(model: str | None, shape: tuple[int, ...] | None, *, gpus: tuple[str, ...] = (),
              precision: str | None = None, stages: tuple[str, ...] | None = None, backend: str | None = None,
              name: str | None = None, kwargs: dict[str, Any] | None = None,
              options: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The spec's data for one model; default stages: Tier 1 and the system card, plus the roofline with GPUs.
    ``kwargs`` are the model's keyword arguments, ``options`` stage name -> its options table."""
    source = model_source(model)
    scheme = source.partition(":")[0]
    if shape is None:
        shape = DEFAULT_SHAPES.get(scheme, (1, 3, 32, 32) if source == DEFAULT_MODEL else (1, 3, 224, 224))
    label = name or model_name(source)
    data: dict[str, Any] = {"name": label}
    if backend:
        data["backend"] = backend
    data["precision"] = precision or "fp32"
    data["stages"] = list(stages) if stages else [*DEFAULT_STAGES, *(("roofline",) if gpus else ())]
    if gpus:
        data["gpus"] = list(gpus)
    data["models"] = [{"name": label, "source": source, "input_shape": list(shape), **({"kwargs": kwargs} if kwargs else {})}]
    if options:
        data["options"] = options
    return data


def relocate(data: dict[str, Any], folder: Path) -> dict[str, Any]:
    """``data`` for a spec file in ``folder``: a model file, or a local folder given as a path (``./config``), made
    relative to that folder (as the spec reads them), so the file means what the command line meant."""
    model = dict(data["models"][0])
    module, colon, attr = model["source"].rpartition(":")
    scheme, _, target = model["source"].partition(":")
    if colon and module.endswith(".py"):
        model["source"] = f"{_relative(Path(module), folder)}:{attr}"
    elif target.startswith(("./", "../")) or (target and Path(target).is_dir() and not Path(target).is_absolute()):
        model["source"] = f"{scheme}:{_relative(Path(target), folder)}"
    return {**data, "models": [model]}


def _relative(path: Path, folder: Path) -> str:
    relative = Path(os.path.relpath(path.resolve(), folder.resolve())).as_posix()
    return relative if relative.startswith("../") else f"./{relative}"


def _value(value: Any) -> str:
    """One TOML value on one line, written by tomli-w (so every string is escaped the TOML way)."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_key(key)} = {_value(item)}" for key, item in value.items()) + " }"
    return tomli_w.dumps({"v": value}).partition("=")[2].strip()


def _key(key: str) -> str:
    """A TOML key: bare when it can be, else quoted."""
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else _value(key)


def render(data: dict[str, Any]) -> str:
    """The spec as commented TOML; :func:`spec_data`'s keys only."""
    model = data["models"][0]
    scheme = model["source"].partition(":")[0]
    meaning = SHAPE_MEANING.get(scheme, "the shape of the model's one floating input")
    lines = [
        "# rpx spec: `rpx validate THIS_FILE` checks it, `rpx run THIS_FILE` runs it.",
        f"name = {_value(data['name'])}",
        f"backend = {_value(data.get('backend', 'cpu'))}   # cpu, cuda, mps, jax (`rpx backends`)",
        f"precision = {_value(data['precision'])}   # fp32 | tf32 | fp16 | bf16 | fp8 | int8 (fp8/int8: counted only)",
        "# count_params, count_flops, estimate_traffic (Tier 1), roofline (Tier 2, needs gpus), system_card,",
        "# measure_latency (runs the model); the stages a stage needs are added",
        f"stages = {_value(data['stages'])}",
    ]
    if data.get("gpus"):
        lines.append(f"gpus = {_value(data['gpus'])}   # `rpx gpus` lists them; \"all\" for every known GPU")
    else:
        lines.append('# gpus = ["H100-SXM", "L4"]   # with "roofline" in stages: lower-bound latency on these GPUs')
    lines += [
        f"output = {_value(data.get('output', 'rpx-results/{name}.toml'))}   # .json for JSON",
        "",
        "[[models]]",
        f"name = {_value(model['name'])}",
        f"source = {_value(model['source'])}   # 'pkg.module:callable', 'file.py:callable', or 'hf:', "
        "'torchvision:', 'timm:' names",
        f"input_shape = {_value(model['input_shape'])}   # {meaning}",
    ]
    if scheme == "hf":
        lines.append("# config = { num_hidden_layers = 2 }   # overrides of the model's configuration")
    if model.get("kwargs"):
        lines.append(f"kwargs = {_value(model['kwargs'])}")
    elif scheme == "hf":
        lines.append('# kwargs = { auto_class = "AutoModelForCausalLM" }   # default AutoModel (no task head)')
    else:
        lines.append("# kwargs = {}   # arguments of the build function")
    lines += [
        '# notes = "where the model comes from, caveats"   # kept with the results',
    ]
    for stage, table in data.get("options", {}).items():
        lines += ["", f"[options.{stage}]", *(f"{_key(key)} = {_value(value)}" for key, value in table.items())]
    if "measure_latency" not in data.get("options", {}):
        lines += ["", "# [options.measure_latency]", "# max_seconds = 10   # bounds the whole stage, warm-up included"]
    return "\n".join(lines) + "\n"
