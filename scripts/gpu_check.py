"""Profile specs/gpu_check.toml on the GPU at fp16 and at bf16, then run the batch search of specs/gpu_batch_search.toml
under a hard 8 GB budget, printing every result, the system card included.

Exit status 1 if any stage failed, so scripts/gpu_check.sh reports it. Run from the repository root.
"""

from __future__ import annotations

import sys

import attrs

from rpx_core.api import load_spec, run_spec
from rpx_core.results import dumps
from rpx_core.spec import Spec
from rpx_core.summary import render_run

SPEC = "specs/gpu_check.toml"
BATCH_SEARCH_SPEC = "specs/gpu_batch_search.toml"
PRECISIONS = ("fp16", "bf16")


def run_and_print(spec: Spec, label: str, spec_path: str) -> bool:
    """Run one spec, print its whole results file and the terminal summary; True when every stage succeeded."""
    print(f"\n===== {label} =====", flush=True)
    run = run_spec(spec, spec_path=spec_path)
    print(dumps(run), flush=True)
    print(render_run(run), flush=True)
    failures = [(model.name, stage, record) for model in run.models for stage, record in model.stages.items()
                if record.status != "ok"]
    failures += [("<run>", stage, record) for stage, record in run.run_stages.items() if record.status != "ok"]
    for name, stage, record in failures:
        print(f"!! {name} {stage}: {record.status}: {record.error}", flush=True)
    return not failures


def main() -> int:
    spec = load_spec(SPEC)
    results = [
        run_and_print(attrs.evolve(spec, precision=precision, output=f"rpx-results/gpu-check-{precision}.toml"),
                      f"{SPEC} at {precision}", SPEC)
        for precision in PRECISIONS
    ]
    results.append(run_and_print(load_spec(BATCH_SEARCH_SPEC), BATCH_SEARCH_SPEC, BATCH_SEARCH_SPEC))
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
