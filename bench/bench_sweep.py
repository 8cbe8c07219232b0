"""Sweeps through the real engine: the local executor side by side against one job at a time, the fixed cost of a
job, and Ray's overhead per job on a local Ray instance.

1. A 16-job Tier 1/2 sweep (a Llama-2-7B-shaped decoder on the meta device, 4 batch sizes x 4 sequence lengths;
   count_params + roofline on one GPU) with the local executor: side by side (workers = the usable cores) and one at
   a time (workers = 1), alternating, in this one process. Target: side by side at least 1.7x faster on 2 cores.
2. Fixed cost per job: 16 jobs of a 16x16 Linear (count_params only), one at a time; (wall - the stages' own
   seconds) / 16. Everything rpx does around a job's stages: a worker for it (forked, or reused from the job
   before), sending the task, following its events, writing the results file. Target: under 20 ms.
3. Ray: the same 16 small jobs on a local Ray instance started beforehand (its start is not counted); the same
   fixed cost per job, beside the local executor's.

Run: python bench/bench_sweep.py [rounds]   (needs `pip install 'rpx[ray]'` for part 3)
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from machine import describe_machine

import rpx_core as rpx
from rpx_core.registry.manager import Plugins
from rpx_core.spec.schema import spec_from_dict

LLAMA_7B = {"name": "llama7b", "source": "rpx_plugins.torch.zoo:llama", "kwargs": {"preset": "llama2-7b"},
            "meta_only": True, "inputs": [{"shape": [1, 128], "dtype": "int64", "high": 32000}]}
LINEAR = {"name": "linear", "source": "torch.nn:Linear", "kwargs": {"in_features": 16, "out_features": 16},
          "inputs": [{"shape": [1, 16]}]}


def sweep(model: dict, stages: list[str], axes: dict, executor: str = "local", **options) -> dict:
    return {"name": "bench-sweep", "backend": "cpu", "precision": "bf16", "stages": stages, "gpus": ["H100-SXM"],
            "models": [model], "sweep": axes, "options": {"count_flops": {"count_on": "meta"}},
            "execution": {"executor": executor, "executor_options": options}}


def timed(data: dict, plugins: Plugins, folder: Path) -> tuple[float, float, int]:
    """Wall seconds of one run, the sum of its stages' own seconds, and its job count."""
    spec = spec_from_dict(data, where="bench")
    started = time.perf_counter()
    result = rpx.run_spec(spec, plugins=plugins, output=folder / "out.toml")
    wall = time.perf_counter() - started
    assert result.ok, [(m.name, s, r.error) for m in result.models for s, r in m.stages.items() if r.error]
    stage_seconds = sum(record.seconds or 0.0 for model in result.models for record in model.stages.values())
    return wall, stage_seconds, len(result.models)


def main(rounds: int) -> None:
    print(describe_machine())
    with open("/proc/loadavg") as load:
        print(f"load average at start: {' '.join(load.read().split()[:3])}")
    plugins = Plugins.load()
    shapes = {"batch_size": [1, 2, 4, 8], "seq_len": [128, 256, 512, 1024]}
    small = {"batch_size": list(range(1, 17))}
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        timed(sweep(LINEAR, ["count_params"], {"batch_size": [1]}), plugins, folder)  # start the worker zygote

        print(f"\n1. 16-job Tier 1/2 sweep (llama2-7b shape on meta, count_params + roofline), {rounds} alternating "
              "rounds")
        walls: dict[str, list[float]] = {"side by side": [], "one at a time": []}
        for _ in range(rounds):
            walls["side by side"].append(timed(sweep(LLAMA_7B, ["count_params", "roofline"], shapes), plugins,
                                               folder)[0])
            walls["one at a time"].append(timed(sweep(LLAMA_7B, ["count_params", "roofline"], shapes, workers=1),
                                                plugins, folder)[0])
        for label, values in walls.items():
            print(f"  {label:<14} median {statistics.median(values):7.2f} s  (rounds: "
                  f"{', '.join(f'{v:.2f}' for v in values)})")
        speedup = statistics.median(walls["one at a time"]) / statistics.median(walls["side by side"])
        paired = [alone / both for both, alone in zip(walls["side by side"], walls["one at a time"])]
        print(f"  speed-up {speedup:.2f}x from the medians; per round {', '.join(f'{r:.2f}' for r in paired)}, "
              f"median {statistics.median(paired):.2f}x (target >= 1.7x on 2 cores)")

        print("\n2. fixed cost per job: 16 jobs of a 16x16 Linear, count_params, one at a time")
        local = [timed(sweep(LINEAR, ["count_params"], small, workers=1), plugins, folder) for _ in range(rounds)]
        fixed = statistics.median((wall - stages) / jobs for wall, stages, jobs in local)
        print(f"  local: median wall {statistics.median(w for w, _, _ in local):.3f} s for 16 jobs; "
              f"fixed cost {fixed * 1000:.1f} ms per job (target < 20 ms)")

        try:
            import ray
        except ImportError:
            print("\n3. Ray: not installed (pip install 'rpx[ray]')")
            return
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
        try:
            timed(sweep(LINEAR, ["count_params"], {"batch_size": [1, 2]}, "ray"), plugins, folder)  # warm workers
            on_ray = [timed(sweep(LINEAR, ["count_params"], small, "ray"), plugins, folder) for _ in range(rounds)]
        finally:
            ray.shutdown()
        ray_fixed = statistics.median((wall - stages) / jobs for wall, stages, jobs in on_ray)
        print("\n3. Ray, local instance with 1 CPU (one job at a time, as above; started beforehand), the same 16 jobs")
        print(f"  ray: median wall {statistics.median(w for w, _, _ in on_ray):.3f} s for 16 jobs; fixed cost "
              f"{ray_fixed * 1000:.1f} ms per job ({(ray_fixed - fixed) * 1000:+.1f} ms beside the local executor)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
