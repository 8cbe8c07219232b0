"""Profile specs/gpu_check.toml on the GPU at fp16 and at bf16 and print every result, the system card included.

Exit status 1 if any stage failed, so scripts/gpu_check.sh reports it. Run from the repository root.
"""

from __future__ import annotations

import sys

import attrs

from rpx_core.api import load_spec, run_spec
from rpx_core.results import dumps

SPEC = "specs/gpu_check.toml"
PRECISIONS = ("fp16", "bf16")


def main() -> int:
    spec = load_spec(SPEC)
    all_ok = True
    for precision in PRECISIONS:
        variant = attrs.evolve(spec, precision=precision, output=f"rpx-results/gpu-check-{precision}.toml")
        print(f"\n===== {SPEC} at {precision} =====", flush=True)
        run = run_spec(variant, spec_path=SPEC)
        print(dumps(run), flush=True)
        for model in run.models:
            for stage, record in model.stages.items():
                if record.status != "ok":
                    all_ok = False
                    print(f"!! {model.name} {precision} {stage}: {record.status}: {record.error}", flush=True)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
