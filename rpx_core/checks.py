"""Everything ``rpx validate`` (and ``rpx run``, first) can check without running a model, reported all at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def run_inputs(plan: Any, spec_path: str | None) -> tuple[Path, ...]:
    """Every file the run reads (the spec, model and input-factory files, GPU packs): never written over."""
    paths = [Path(spec_path)] if spec_path else []
    for job in plan.jobs:
        for source in (job.model.source, job.model.input_factory):
            module = (source or "").rpartition(":")[0]
            if module.endswith(".py"):
                paths.append(Path(module))
    paths.extend(Path(plan.spec.base_dir) / pack for pack in plan.spec.gpu_packs)
    return tuple(paths)
