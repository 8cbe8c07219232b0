"""A shape sweep of one big model: ``specs/llama2_70b_shapes.toml`` (a Llama-2-70B-shaped decoder on meta at 16
sequence lengths, Tier 1 + roofline on four GPUs) run by ``rpx run`` in a fresh process, wall time from the command's
start to its exit (torch's import and the worker processes included). Side by side in the same rounds: the same
sweep with ``replay_repeats = false`` (every one of the 80 layers traced at every shape), and a check that both
results files hold the same figures.

Target on 2 cores: the sweep in under 8 s in total.

Run: python bench/bench_shape_sweep.py [rounds]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from machine import describe_machine

SPEC = Path(__file__).resolve().parents[1] / "specs" / "llama2_70b_shapes.toml"
RPX = Path(sys.executable).with_name("rpx")


def timed_run(spec: Path, output: Path) -> float:
    started = time.perf_counter()
    subprocess.run([str(RPX), "run", str(spec), "--quiet", "-o", str(output)], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def figures(path: Path) -> dict:
    """Every stage result of every job, without timings and without the note of which layers were replayed."""
    found = {}
    for model in tomllib.loads(path.read_text())["models"]:
        for stage, record in model["stages"].items():
            assert record["status"] == "ok", (model["name"], stage, record.get("error"))
            result = dict(record["result"])
            result.pop("replayed", None)
            found[model["name"], stage] = result
    return found


def main(rounds: int) -> None:
    print(describe_machine())
    with open("/proc/loadavg") as load:
        print(f"load average at start: {' '.join(load.read().split()[:3])}")
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        traced_spec = folder / "traced.toml"
        traced_spec.write_text(SPEC.read_text().replace('count_on = "meta"', 'count_on = "meta"\nreplay_repeats = false'))
        walls: dict[str, list[float]] = {"replayed": [], "every layer traced": []}
        for _ in range(rounds):
            walls["replayed"].append(timed_run(SPEC, folder / "replayed-out.toml"))
            walls["every layer traced"].append(timed_run(traced_spec, folder / "traced-out.toml"))
        same = figures(folder / "replayed-out.toml") == figures(folder / "traced-out.toml")
        jobs = len(tomllib.loads((folder / "replayed-out.toml").read_text())["models"])
    print(f"\n{jobs} jobs (llama2-70b shape, seq_len 128..2048, count_params + count_flops + estimate_traffic + "
          f"roofline on 4 GPUs), `rpx run` wall from start to exit, {rounds} alternating rounds")
    for label, values in walls.items():
        print(f"  {label:<19} median {statistics.median(values):6.2f} s  (rounds: {', '.join(f'{v:.2f}' for v in values)})")
    ratio = statistics.median(walls["every layer traced"]) / statistics.median(walls["replayed"])
    verdict = "OK" if statistics.median(walls["replayed"]) < 8 else "MISSED"
    print(f"  replayed is {ratio:.2f}x faster; target < 8 s in total: {verdict}; identical figures: {same}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
