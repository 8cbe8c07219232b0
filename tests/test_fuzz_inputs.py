"""Property tests at the command line: hostile values in a spec, a GPU pack, a named model's configuration overrides
and a plugin's registration hooks get exit 0, 1 or 2 from ``rpx`` (never 3, an internal error), and nothing is
written but the run's output.

rpx runs in-process (``rpx_core.cli.main``, model code in-process too) for speed; a few examples go through real
``rpx`` processes. The hook values come from a real plugin distribution, pip-installed once, whose registration
hooks return what the example says (an environment variable carries it). 25 examples per property keep the file
quick; ``RPX_FUZZ_EXAMPLES=500`` searches harder.
"""

from __future__ import annotations

import copy
import json
import math
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rpx_core.cli import main
from rpx_core.spec.schema import load_spec
from tests.conftest import make_plugin_package, pip_install_target, rpx_cli

#: Values a hostile or careless user writes: non-finite, huge, negative, zero, of the wrong kind, paths out, escapes.
HOSTILE = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, 1e300, -1.0, 0, -1, 2**31, 2**63, 99999999999999999999, 0.5,
                     True, False, "", "abc", "false", "yes", "two", "../../x", "/proc/self/mem", "\x1b[31mred",
                     "{name.__class__}", "bf61", "H100-SXN", "ray", [], {}, [0], [99999999999999999999], ["bf61"],
                     [math.nan], {"a": 1}]),
    st.integers(-2**70, 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
)

MODEL = {"name": "lin", "source": "torch.nn:Linear", "kwargs": {"in_features": 4, "out_features": 2},
         "inputs": [{"shape": [1, 4]}]}
SPEC = {
    "name": "fuzz",
    "stages": ["count_params", "roofline"],
    "gpus": ["H100-SXM"],
    "batch_sizes": [1, 2],
    "output": "out/{name}.toml",
    "execution": {"isolation": "in-process", "stage_timeout": 60, "job_timeout": 120, "interrupt_grace": 5},
    "options": {"count_flops": {"top_k": 5}, "roofline": {"precisions": ["fp32"]},
                "measure_latency": {"max_seconds": 1}},
    "models": [MODEL],
}
#: Where the fuzz writes a hostile value: the spec keys every concept of issue-sized mistakes lives at.
PATHS = [("batch_sizes",), ("batch_sizes", 0), ("gpus",), ("gpus", 0), ("precision",), ("stages",), ("stages", 0),
         ("execution", "stage_timeout"), ("execution", "job_timeout"), ("execution", "interrupt_grace"),
         ("execution", "executor"), ("execution", "isolation"), ("options", "count_flops", "top_k"),
         ("options", "count_flops", "batch_size"), ("options", "roofline", "precisions"),
         ("options", "roofline", "precisions", 0), ("options", "measure_latency", "max_seconds"),
         ("options", "batch_search"), ("sweep",), ("output",), ("name",), ("backend",), ("device",),
         ("models", 0, "inputs", 0, "shape"), ("models", 0, "inputs", 0, "shape", 0), ("models", 0, "input_shape"),
         ("models", 0, "kwargs", "in_features"), ("models", 0, "config"), ("models", 0, "source"),
         ("choose", "gpus"), ("gpu_packs",), ("on_unavailable",)]
FUZZ = settings(max_examples=int(os.environ.get("RPX_FUZZ_EXAMPLES", "25")), deadline=None, suppress_health_check=list(HealthCheck))


def put(data: dict, path: tuple, value: Any) -> dict:
    """``data`` with ``value`` at ``path``, creating tables on the way (a list index out of range appends)."""
    data = copy.deepcopy(data)
    node: Any = data
    for part in path[:-1]:
        if isinstance(node, dict):
            node = node.setdefault(part, {})
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            return data
    if isinstance(node, dict):
        node[path[-1]] = value
    elif isinstance(node, list) and isinstance(path[-1], int):
        node[path[-1]:path[-1] + 1] = [value]
    return data


def files(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(path.relative_to(folder)): (path.stat().st_size, path.stat().st_mtime_ns)
            for path in folder.rglob("*") if path.is_file()}


@contextmanager
def workspace() -> Iterator[Path]:
    """An empty working folder for one example (hypothesis runs many in one test function)."""
    before = os.getcwd()
    with tempfile.TemporaryDirectory() as folder:
        os.chdir(folder)
        try:
            yield Path(folder)
        finally:
            os.chdir(before)


def write_spec(folder: Path, data: dict) -> Path | None:
    try:
        text = tomli_w.dumps(data)
    except (TypeError, ValueError):  # not writable as TOML (a None, a mixed list): no spec file can say it
        return None
    path = folder / "spec.toml"
    path.write_text(text)
    return path


def assert_wrote_only_the_output(folder: Path, spec: Path, before: dict[str, tuple[int, int]]) -> None:
    output = (folder / load_spec(spec).output_path()).resolve()
    changed = {folder / name for name, stamp in files(folder).items() if before.get(name) != stamp}
    assert {path.resolve() for path in changed} <= {output}, (changed, output)


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(PATHS), HOSTILE), min_size=1, max_size=3),
       st.sampled_from([False, False, False, True]))
def test_hostile_spec_values_are_exit_0_1_or_2_and_only_the_output_is_written(changes, run):
    data = SPEC
    for path, value in changes:
        data = put(data, path, value)
    with workspace() as folder:
        path = write_spec(folder, data)
        if path is None:
            return
        before = files(folder)
        code = main(["validate", str(path)])
        assert code in (0, 2)
        assert files(folder) == before  # validate writes nothing
        if run and code == 0:  # model code in rpx's process: no worker to start per example
            assert main(["run", str(path), "--quiet", "--isolation", "in-process"]) in (0, 1)
            assert_wrote_only_the_output(folder, path, before)


PACK = {"pack": {"name": "fuzz", "version": "1", "source": "made up"},
        "gpu": [{"name": "Fuzz-1", "vendor": "Acme", "segment": "datacenter", "memory_gb": 8, "memory_type": "HBM3",
                 "bandwidth_gb_s": 100, "source": "made up", "peaks": {"fp32": {"tflops": 10}}}]}
PACK_PATHS = [("gpu", 0, "memory_gb"), ("gpu", 0, "bandwidth_gb_s"), ("gpu", 0, "peaks", "fp32", "tflops"),
              ("gpu", 0, "peaks", "fp32", "sparse_tflops"), ("gpu", 0, "peaks", "fp32", "estimate"),
              ("gpu", 0, "peaks", "bf61"), ("gpu", 0, "segment"), ("gpu", 0, "name"), ("gpu", 0, "aliases"),
              ("gpu", 0, "peaks"), ("gpu", 0), ("gpu",), ("pack",), ("pack", "name"), ("gpu", 0, "pack")]


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(PACK_PATHS), HOSTILE), min_size=1, max_size=3))
def test_hostile_pack_values_are_lines_of_validate_and_gpus(changes):
    pack = PACK
    for path, value in changes:
        pack = put(pack, path, value)
    with workspace() as folder:
        if write_spec(folder, pack) is None:
            return
        (folder / "spec.toml").rename(folder / "pack.toml")
        spec = write_spec(folder, {**SPEC, "gpus": ["all"], "gpu_packs": ["pack.toml"]})
        before = files(folder)
        assert main(["validate", str(spec)]) in (0, 2)
        assert main(["gpus", "fuzz", "--pack", "pack.toml", "--json"]) in (0, 2)
        assert files(folder) == before


@FUZZ
@given(st.dictionaries(st.sampled_from(["vocab_size", "n_layer", "n_layr", "n_head", "resid_pdrop", "use_cache",
                                        "eos_token_id", "summary_type", "num_hidden_layers", "hidden", ""]),
                       HOSTILE, min_size=1, max_size=3),
       st.dictionaries(st.sampled_from(["trust_remote_code", "auto_class", "auto_clas"]), HOSTILE, max_size=2))
def test_hostile_configuration_overrides_and_kwargs_of_a_named_model(config, kwargs):
    with workspace() as folder:
        (folder / "gpt2").mkdir()
        (folder / "gpt2" / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 1, "n_embd": 8,
                                                                  "n_head": 2, "vocab_size": 50}))
        model = {"name": "g", "source": "hf:./gpt2", "input_shape": [1, 4], "config": config, "kwargs": kwargs}
        spec = write_spec(folder, {"stages": ["count_params"], "models": [model]})
        if spec is None:
            return
        before = files(folder)
        assert main(["validate", str(spec)]) in (0, 2)
        assert files(folder) == before


HOOKS = ("rpx_register_backends", "rpx_register_gpu_packs", "rpx_register_stages", "rpx_register_executors",
         "rpx_register_model_sources", "rpx_register_model_adapters", "rpx_register_op_formulas")
PLUGIN = '''
import json
import os
from pathlib import Path


def value(hook):
    """What the example says this hook returns: JSON, with "@path:X" for a Path and "@object" for an object."""
    def decode(item):
        if isinstance(item, str) and item.startswith("@path:"):
            return Path(item[6:])
        if item == "@object":
            return object()
        if isinstance(item, list):
            return [decode(member) for member in item]
        return item
    returns = json.loads(os.environ.get("RPX_FUZZ_RETURNS", "{}"))
    if hook in returns:
        return decode(returns[hook])
    return None
''' + "".join(f"\n\ndef {hook}():\n    return value({hook!r})\n" for hook in HOOKS)

RETURNS = st.one_of(HOSTILE.filter(lambda v: not (isinstance(v, float) and not math.isfinite(v))),
                    st.lists(st.one_of(st.sampled_from(["@path:/nonexistent", "@path:/", "@object", "cpu", 42, None]),
                                       st.text(max_size=4)), max_size=3))


@pytest.fixture(scope="module")
def fuzz_plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fuzz-plugin")
    package = make_plugin_package(root, "rpx-fuzz", "rpx_fuzz", "fuzz", PLUGIN)
    return pip_install_target(package, root / "site")


def test_hostile_registration_returns_leave_the_plugin_out_never_the_tool(fuzz_plugin_site, monkeypatch):
    monkeypatch.syspath_prepend(str(fuzz_plugin_site))

    @FUZZ
    @given(st.dictionaries(st.sampled_from(HOOKS), RETURNS, min_size=1, max_size=3))
    def check(returns):
        monkeypatch.setenv("RPX_FUZZ_RETURNS", json.dumps(returns))
        with workspace() as folder:
            spec = write_spec(folder, {**SPEC, "execution": {"isolation": "in-process"}})
            before = files(folder)
            assert main(["plugins"]) == 0
            assert main(["gpus"]) in (0, 2)
            assert main(["validate", str(spec)]) in (0, 2)
            assert files(folder) == before

    check()


def test_a_few_hostile_specs_through_real_rpx_processes(tmp_path: Path) -> None:
    cases = [("batch_sizes", [99999999999999999999]), ("execution", {"stage_timeout": math.nan, "job_timeout": -1,
                                                                       "interrupt_grace": math.inf}),
             ("options", {"roofline": {"precisions": ["bf61"]}}), ("gpus", ["\x1b[31mred"])]
    for key, value in cases:
        (tmp_path / "spec.toml").write_text(tomli_w.dumps({**SPEC, key: value}))
        before = files(tmp_path)
        done = rpx_cli("validate", "spec.toml", cwd=tmp_path)
        assert done.returncode == 2 and "internal error" not in done.stderr, done.stderr
        assert files(tmp_path) == before
    (tmp_path / "spec.toml").write_text(tomli_w.dumps({**SPEC, "execution": {}}))  # valid: a real run, in workers
    done = rpx_cli("run", "spec.toml", "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert set(files(tmp_path)) == {"spec.toml", "out/fuzz.toml"}
