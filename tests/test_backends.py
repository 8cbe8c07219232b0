"""Backend selection: an unavailable backend is one line before any model is built, or skipped when the spec says so."""

from __future__ import annotations

import json

import pytest
import torch

from rpx_core.api import run_spec
from rpx_core.registry.manager import Plugins
from rpx_core.spec.schema import spec_from_dict
from tests.conftest import rpx_cli

BUILD_LOG: list[str] = []


def exploding_factory():
    BUILD_LOG.append("built")
    raise AssertionError("the model must not be built when the backend is unavailable")


SPEC = """
backend = "cuda"
stages = ["count_params", "measure_latency"]
[[models]]
name = "m"
source = "torch.nn:Identity"
inputs = [{ shape = [1, 4] }]
"""


NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="describes a machine without CUDA")


@NO_CUDA
def test_unavailable_backend_is_one_line_naming_backend_and_reason(write_spec):
    done = rpx_cli("run", str(write_spec(SPEC)))
    assert done.returncode == 2
    assert done.stderr.strip() == ("rpx: error: backend 'cuda' is not available on this machine: "
                                  f"CUDA build not installed (torch {torch.__version__} was built without CUDA)")


@NO_CUDA
def test_unavailable_backend_can_be_skipped_without_building_the_model():
    spec = spec_from_dict({"backend": "cuda", "on_unavailable": "skip", "stages": ["count_params"],
                           "models": [{"name": "m", "source": f"{__name__}:exploding_factory", "inputs": [{"shape": [1]}]}]})
    run = run_spec(spec, plugins=Plugins.load(), output=None)
    record = run.model("m").stages["count_params"]
    assert record.status == "skipped" and record.error.startswith("backend 'cuda' is not available on this machine")
    assert BUILD_LOG == []
    assert not run.ok


def test_rpx_backends_reports_availability_with_reasons():
    done = rpx_cli("backends", "--json")
    rows = {row["name"]: row for row in json.loads(done.stdout)}
    assert rows["cpu"]["available"] is True
    assert rows["cuda"]["available"] is torch.cuda.is_available() and rows["cuda"]["reason"]
    assert rows["mps"]["available"] is False and rows["mps"]["reason"]
