"""Programs over a 2-device CPU mesh, counted and timed through a real ``rpx run`` in a subprocess: JAX must see
``--xla_force_host_platform_device_count=2`` before it initialises, which the rest of the suite's JAX must not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SPEC = Path(__file__).resolve().parents[1] / "specs" / "jax_mesh.toml"


@pytest.fixture(scope="module")
def mesh_run(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("mesh") / "mesh.json"
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    command = [sys.executable, "-m", "rpx_core.cli", "run", str(SPEC), "-o", str(out)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return {model["name"]: model["stages"] for model in json.loads(out.read_text())["models"]}


def mlp_macs(batch: int = 8) -> int:
    return batch * (64 * 128 + 128 * 10)  # the whole MLP's matrix work, however it is split


def test_a_sharded_mlp_is_counted_in_total_and_per_device_and_timed_on_the_mesh(mesh_run):
    stages = mesh_run["sharded-mlp"]
    flops = stages["count_flops"]["result"]
    assert flops["macs"] == mlp_macs()  # the global program: XLA partitions it, the work stays the same
    assert flops["devices"] == 2 and flops["per_device_flops"] == flops["total_flops"] // 2
    # XLA's figure is the partitioned program of one device: about half of the whole
    assert flops["compiler_figures"]["flops"] < 0.6 * flops["total_flops"]
    latency = stages["measure_latency"]
    assert latency["status"] == "ok", latency.get("error")
    assert latency["result"]["p50_ms"] > 0
    row = latency["result"]["throughput"][0]
    assert row["samples_per_s"] > 0 and row["pipelined_samples_per_s"] > 0


def test_a_shard_map_program_counts_its_body_once_per_device(mesh_run):
    stages = mesh_run["shard-map-mlp"]
    flops = stages["count_flops"]["result"]
    assert flops["macs"] == mlp_macs()  # each device: half the hidden layer, twice over
    assert flops["devices"] == 2
    assert any("shard_map" in line and "each of 2 devices" in line for line in flops["control_flow"])
    # the psum that adds the partial outputs is a collective without a FLOP formula: listed, not counted
    assert "psum_invariant" in flops["uncounted_ops"]
    assert stages["measure_latency"]["status"] == "ok", stages["measure_latency"].get("error")


def test_a_batch_split_over_the_devices_is_timed_at_the_shape_it_was_counted_at(mesh_run):
    """A data-parallel shard_map needs a batch that divides by the 2 devices: latency runs the batch of 8 the spec
    writes and count_flops counted (timed at batch 1, as rpx did before, JAX refused it as indivisible)."""
    stages = mesh_run["data-parallel-mlp"]
    flops, latency = stages["count_flops"]["result"], stages["measure_latency"]
    assert latency["status"] == "ok", latency.get("error")
    assert latency["result"]["measured_inputs"] == flops["counted_inputs"] == ["float32[8,64]"]
    assert latency["result"]["measured_batch_size"] == 8 and flops["macs"] == mlp_macs()
    assert [row["batch_size"] for row in latency["result"]["throughput"]] == [2, 8]
    assert all(row["samples_per_s"] > 0 for row in latency["result"]["throughput"])


def test_a_pmap_program_counts_its_body_once_per_device(mesh_run):
    stages = mesh_run["pmap-mlp"]
    flops = stages["count_flops"]["result"]
    assert flops["macs"] == 2 * mlp_macs(batch=4)  # two devices, a batch of 4 each
    assert flops["devices"] == 2 and flops["per_device_flops"] == flops["total_flops"] // 2
    assert stages["measure_latency"]["status"] == "ok", stages["measure_latency"].get("error")
