"""The GPU check: everything rpx does on a GPU, run on a node with no network, with the node's own Python.

    python3 scripts/gpu_check.py --wheelhouse DIR [--out DIR] [--device cuda|mps]    (scripts/gpu_check.sh wraps it)

1. **Environment.** The interpreter running this script is used as it is: torch (and jax, numpy) are never
   installed or replaced. Each of rpx's small dependencies and test tools (scripts/gpu_requirements.txt) that this
   Python lacks, or has at a version rpx cannot use, is installed from the wheelhouse (prepared beforehand on a
   machine with network by ``scripts/gpu_wheelhouse.sh DIR``) into a private folder put first on ``sys.path`` /
   ``PYTHONPATH``; rpx itself is installed there from this checkout, without dependencies. Nothing outside that
   folder changes, and pip never reaches for a network (``--no-index``).
2. **Checks**, one line each (``PASS|FAIL|SKIP name: figure``): the backend's tests that need the device, the same
   modules' logic tests, a profile of specs/gpu_check.toml at fp32, tf32, fp16 and bf16 (Tier 1 to latency), the
   measured p50 latency against the roofline bound of the GPU rpx recognises, for the same call (bound / measured
   must lie in (0, 1]; a fraction above 1 fails, naming the figure that disagrees),
   batch search of specs/gpu_batch_search.toml under a hard 8 GB budget, and a direct scan in this script (a
   bisection of each stage's batch size, each size measured from an empty allocator cache under the same cap)
   that batch search's limits must agree with (within its 5% resolution).
3. **Results** for review in the output folder: ``gpu-check.json`` (every check with its figures) and the rpx
   results file of every run.

Exit status: 0 every check passed; 1 a check failed; 2 the environment could not be prepared (no torch, or a
dependency neither installed nor in the wheelhouse); 3 no GPU (torch sees no device of the kind asked for: every GPU
step says "no GPU"), after the environment and the logic tests were checked.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = ROOT / "scripts" / "gpu_requirements.txt"
NO_GPU, ENVIRONMENT, FAILED = 3, 2, 1
PRECISIONS = {"cuda": ("fp32", "tf32", "fp16", "bf16"), "mps": ("fp32", "fp16", "bf16")}
DEVICE_TESTS = {"cuda": ["tests/test_cuda_backend.py", "tests/test_system_card.py"], "mps": ["tests/test_mps_backend.py"]}
PROFILE_SPEC = ROOT / "specs" / "gpu_check.toml"
BATCH_SEARCH_SPEC = ROOT / "specs" / "gpu_batch_search.toml"
LOGIC_TESTS = ["tests/test_cuda_backend.py", "tests/test_mps_backend.py", "tests/test_batch_search_gpu.py"]


class Report:
    """Prints one line per check and keeps every check for gpu-check.json."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.checks: list[dict] = []

    def line(self, status: str, name: str, figure: str, **details) -> None:
        print(f"{status} {name}: {figure}", flush=True)
        self.checks.append({"status": status, "name": name, "figure": figure, **details})

    def write(self, exit_code: int, **facts) -> Path:
        path = self.out / "gpu-check.json"
        data = {"exit_code": exit_code, "python": sys.executable, **facts, "checks": self.checks}
        path.write_text(json.dumps(data, indent=2, default=str) + "\n")
        print(f"results: {path}", flush=True)
        return path


# -- 1. environment ----------------------------------------------------------------------------------------------------


def unmet_requirements(lines: list[str]) -> list[str]:
    """The requirements this interpreter (with the private folder first) does not meet, as written."""
    from pip._vendor.packaging.requirements import Requirement  # pip is on every node that can install anything

    unmet = []
    for line in lines:
        requirement = Requirement(line)
        try:
            version = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            unmet.append(line)
            continue
        if not requirement.specifier.contains(version, prereleases=True):
            unmet.append(line)
    return unmet


def pip(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    command = [sys.executable, "-m", "pip", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env)


def prepare_environment(report: Report, wheelhouse: Path, private: Path) -> bool:
    """Install what is missing into ``private`` (never torch, jax or anything the node already has right)."""
    private.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(private))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(private), str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        report.line("FAIL", "environment", f"torch is not installed for {sys.executable}; the check never installs it")
        return False
    lines = [line.split("#")[0].strip() for line in REQUIREMENTS.read_text().splitlines()]
    unmet = unmet_requirements([line for line in lines if line])
    if unmet:
        if not wheelhouse.is_dir():
            report.line("FAIL", "environment", f"missing {', '.join(unmet)} and no wheelhouse at {wheelhouse}")
            return False
        done = pip("install", "--quiet", "--no-index", "--find-links", str(wheelhouse), "--target", str(private),
                   "--upgrade", *unmet)  # fmt: skip
        if done.returncode != 0:
            report.line("FAIL", "environment", f"could not install {', '.join(unmet)} from {wheelhouse}",
                        pip_output=done.stdout + done.stderr)  # fmt: skip
            return False
    importlib.invalidate_caches()
    built = pip("install", "--quiet", "--no-index", "--no-deps", "--no-build-isolation", "--target", str(private),
                "--upgrade", str(ROOT))  # fmt: skip
    rpx_from = "installed into the private folder" if built.returncode == 0 else "run from the checkout (PYTHONPATH)"
    importlib.invalidate_caches()
    still = unmet_requirements([line for line in lines if line])
    if still:
        report.line("FAIL", "environment", f"still missing after installing: {', '.join(still)}")
        return False
    report.line(
        "PASS", "environment",
        f"{sys.executable} (Python {platform.python_version()}), torch {torch_version} as found; "
        f"installed from the wheelhouse: {', '.join(unmet) or 'nothing'}; rpx {rpx_from}",
        installed=unmet, private=str(private),
    )  # fmt: skip
    return True


# -- 2. checks ---------------------------------------------------------------------------------------------------------


def pytest_line(report: Report, name: str, args: list[str], gpu: bool) -> None:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=ROOT,
                          capture_output=True, text=True)  # fmt: skip
    summary = (done.stdout.strip().splitlines() or ["no output"])[-1]
    seconds = time.perf_counter() - started
    if not gpu and done.returncode in (0, 5):  # without a device, the device tests skip
        report.line("SKIP", name, f"no GPU ({summary})")
    else:
        report.line("PASS" if done.returncode == 0 else "FAIL", name, f"{summary} (pytest, {seconds:.0f} s wall)",
                    output=done.stdout[-4000:] + done.stderr[-2000:])  # fmt: skip
        if done.returncode != 0:  # what failed, on the console too: a node's output may be all the reviewer gets
            for line in (done.stdout + done.stderr).strip().splitlines()[-25:]:
                print(f"    {line}", flush=True)


def gpu_present(device: str) -> tuple[bool, str]:
    import torch

    if device == "cuda":
        if not torch.cuda.is_available():
            return False, f"no GPU (torch {torch.__version__}, built for CUDA {torch.version.cuda}, sees no CUDA device)"
        return True, ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    if not torch.backends.mps.is_available():
        return False, f"no GPU (torch {torch.__version__} sees no MPS device)"
    return True, "Apple GPU (MPS)"


def profile_lines(report: Report, out: Path, device: str, precisions: tuple[str, ...]) -> None:
    """specs/gpu_check.toml at each precision; the measured p50 against the recognised GPU's roofline bound."""
    import attrs

    from rpx_core.api import load_spec, run_spec

    spec = load_spec(PROFILE_SPEC)
    for precision in precisions:
        path = out / f"gpu-check-{precision}.toml"
        started = time.perf_counter()
        run = run_spec(attrs.evolve(spec, backend=device, device=f"{device}:0" if device == "cuda" else device,
                                    precision=precision, output=str(path)), spec_path=str(PROFILE_SPEC))  # fmt: skip
        seconds = time.perf_counter() - started
        for model in run.models:
            failed = {stage: record.error for stage, record in model.stages.items() if record.status != "ok"}
            name = f"profile {model.name} {precision}"
            if failed:
                report.line("FAIL", name, "; ".join(f"{stage}: {error}" for stage, error in failed.items()))
                continue
            latency, roofline = model.result("measure_latency"), model.result("roofline")
            report.line("PASS", name, f"p50 {latency.p50_ms:.3f} ms, {model.result('count_flops').total_flops / 1e9:.1f} "
                        f"GFLOP, run {seconds:.0f} s", results=str(path))  # fmt: skip
            bound_line(report, f"latency vs roofline {model.name} {precision}", latency, roofline,
                       model.result("count_flops"), precision)


def bound_line(report: Report, name: str, latency, roofline, flops, precision: str) -> None:
    """Bound / measured of the same call on the GPU rpx recognises (rpx_plugins.efficiency); a fraction above 1, or
    figures that describe different calls, fail with what disagrees."""
    from rpx_plugins.efficiency import efficiency

    local = roofline.local_gpu
    if local is None or precision not in roofline.gpus.get(local, {}):
        reason = "the GPU is not in rpx's catalogue" if local is None else f"no {precision} peak for {local}"
        report.line("SKIP", name, reason)
        return
    found = efficiency(latency, roofline, flops)
    figure = f"bound {found.bound_ms:.4f} ms / measured {found.measured_ms:.4f} ms on {local}"
    if found.fraction is None:
        report.line("FAIL", name, f"{figure}: {found.problem}", fraction=found.bound_ms / found.measured_ms)
        return
    report.line("PASS", name, f"{figure} = {found.fraction:.3f}", fraction=found.fraction)


def batch_search_lines(report: Report, out: Path, device: str) -> None:
    import attrs

    from rpx_core.api import load_spec, run_spec

    spec = load_spec(BATCH_SEARCH_SPEC)
    path = out / "gpu-batch-search.toml"
    spec = attrs.evolve(spec, backend=device, device=f"{device}:0" if device == "cuda" else device, output=str(path))
    started = time.perf_counter()
    run = run_spec(spec, spec_path=str(BATCH_SEARCH_SPEC))
    record = run.run_stages["batch_search"]
    if record.status != "ok":
        report.line("FAIL", "batch search", f"{record.status}: {record.error}")
        return
    result = record.result
    report.line("PASS" if result.feasible and result.budget_enforced else "FAIL", "batch search",
                f"{result.chosen_batch_sizes} at {result.frames_per_second:.4g} frames/s in {result.trial_count} trials, "
                f"{time.perf_counter() - started:.0f} s, budget enforced: {result.budget_enforced}",
                results=str(path))  # fmt: skip
    scan_lines(report, spec, result)


def scan_lines(report: Report, spec, result) -> None:
    """Each stage's largest batch within the usable budget, found here by bisection with every other model resident,
    each size measured from an empty cache under the same hard cap (an out-of-memory error is "does not fit")."""
    from rpx_core.execution.context import StageContext
    from rpx_core.registry.manager import Plugins
    from rpx_core.spec.plan import make_plan
    from rpx_core.types.batch_search import used_bytes

    plugins = Plugins.load()
    plan = make_plan(spec, plugins)
    backend = plugins.backend(spec.backend)
    device = spec.device
    contexts = [StageContext(job, backend, plugins=plugins, gpu_catalog=plan.gpu_catalog) for job in plan.jobs]
    models = [context.model() for context in contexts]
    backend.set_memory_budget(device, result.budget_bytes)
    try:
        for stage, context in enumerate(contexts):
            def fits(size: int) -> bool:
                backend.release_cached_memory(device)
                backend.reset_peak_memory(device)
                try:
                    args, kwargs = backend.make_inputs(context.job.model, size, context.job.precision, device)
                    with backend.inference_context():
                        backend.call_model(models[stage], args, kwargs)
                    del args, kwargs
                except Exception as exc:
                    if not backend.is_out_of_memory(exc):
                        raise
                    backend.recover_from_oom(device)
                    return False
                used = used_bytes(backend.read_peak_memory(device))
                return used is not None and used <= result.usable_bytes

            low, high = 0, plan.options["batch_search"].max_batch + 1  # fits(low), not fits(high)
            while high - low > 1:
                middle = (low + high) // 2
                low, high = (middle, high) if fits(middle) else (low, middle)
            found = result.stages[stage].largest_fitting_batch or 0
            agree = low == 0 and found == 0 or abs(found - low) <= max(1, 0.05 * low)
            report.line("PASS" if agree else "FAIL", f"direct scan {context.job.model.name}",
                        f"largest fitting batch: scan {low}, batch search {found}")  # fmt: skip
    finally:
        backend.set_memory_budget(device, None)
        models.clear()  # the scan's copies of the models leave the device before the next check
        backend.recover_from_oom(device)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheelhouse", type=Path, default=ROOT / "wheelhouse")
    parser.add_argument("--out", type=Path, default=ROOT / "rpx-gpu-check")
    parser.add_argument("--device", choices=("cuda", "mps"), default="cuda")
    parser.add_argument("--logic-tests", nargs="*", default=LOGIC_TESTS, help="the CPU logic tests to run")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    report = Report(args.out)
    started = time.perf_counter()
    if not prepare_environment(report, args.wheelhouse, args.out / "site"):
        report.write(ENVIRONMENT)
        return ENVIRONMENT
    present, found = gpu_present(args.device)
    report.line("PASS" if present else "SKIP", "gpu", found)
    pytest_line(report, f"tests needing the device ({args.device})", ["-m", args.device, *DEVICE_TESTS[args.device]],
                gpu=present)  # fmt: skip
    if args.logic_tests:
        pytest_line(report, "logic tests of the GPU modules", ["-m", "not cuda", *args.logic_tests], gpu=True)
    if present:
        profile_lines(report, args.out, args.device, PRECISIONS[args.device])
        batch_search_lines(report, args.out, args.device)
    else:
        for name in ("profile at " + ", ".join(PRECISIONS[args.device]), "latency vs roofline", "batch search",
                     "direct scan"):  # fmt: skip
            report.line("SKIP", name, "no GPU")
    failed = any(check["status"] == "FAIL" for check in report.checks)
    code = FAILED if failed else (0 if present else NO_GPU)
    report.write(code, device=args.device, gpu=found, seconds=round(time.perf_counter() - started, 1))
    print(f"exit {code} ({'failed' if failed else 'passed' if present else 'no GPU'})", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
