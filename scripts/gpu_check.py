"""The GPU check: everything rpx does on a GPU, run on a node with no network, with the node's own Python.

    python3 scripts/gpu_check.py --wheelhouse DIR [--out DIR] [--device cuda|mps] [--only batch-search]
                                 [--precisions fp32,bf16]
    (scripts/gpu_check.sh wraps it)

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
   batch search of specs/gpu_batch_search.toml under a hard 8 GB budget (``rpx run``'s way: in a worker process),
   and a direct scan that batch search's limits must agree with (within one resolution step, and at most 2%): a
   plain bisection of each stage's batch size by real trials under the same conditions, run by batch search's own
   trial code (rpx_plugins.batch_search.direct_scan) in a fresh process of its own (``--direct-scan``), every model
   resident, the allocator capped as the search caps it, each trial from an empty cache. A disagreement is batch
   search's defect, not the check's. ``--only batch-search`` runs that comparison alone (about a minute).
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

    spec = with_device(load_spec(PROFILE_SPEC), device)
    for precision in precisions:
        path = out / f"gpu-check-{precision}.toml"
        started = time.perf_counter()
        run = run_spec(attrs.evolve(spec, precision=precision, output=str(path)), spec_path=str(PROFILE_SPEC))
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

    spec = with_device(load_spec(BATCH_SEARCH_SPEC), device)  # the constant read now: tests point it elsewhere
    path = out / "gpu-batch-search.toml"
    started = time.perf_counter()
    run = run_spec(attrs.evolve(spec, output=str(path)), spec_path=str(BATCH_SEARCH_SPEC))
    record = run.run_stages["batch_search"]
    if record.status != "ok":
        report.line("FAIL", "batch search", f"{record.status}: {record.error}")
        return
    result = record.result
    limits = tuple(stage.largest_fitting_batch for stage in result.stages)
    report.line("PASS" if result.feasible and result.budget_enforced == (device != "cpu") else "FAIL", "batch search",
                f"{result.chosen_batch_sizes} at {result.frames_per_second:.4g} frames/s in {result.trial_count} trials, "
                f"{time.perf_counter() - started:.0f} s, budget enforced: {result.budget_enforced}, limits {limits}, this "
                f"process at the start {mb(result.start_bytes)}, others {mb(result.others_at_start_bytes)}; "
                f"{'; '.join(result.notes) or 'no notes'}", results=str(path))  # fmt: skip
    scan_lines(report, out, device, result, BATCH_SEARCH_SPEC)


def with_device(spec, device: str):
    import attrs

    return attrs.evolve(spec, backend=device, device=f"{device}:0" if device == "cuda" else device)


def mb(value: int | None) -> str:
    return "unknown" if value is None else f"{value / 1e6:.0f} MB"


#: How far batch search's limit may lie from the direct scan's: one resolution step, and at most this fraction.
AGREEMENT = 0.02


def agrees(found: int | None, exact: int | None) -> bool:
    """Within ``AGREEMENT`` of the exact limit (at least one batch size either way), or both none."""
    if found is None or exact is None:
        return found == exact
    return abs(found - exact) <= max(1, AGREEMENT * exact)


def scan_lines(report: Report, out: Path, device: str, result, spec_path: Path) -> None:
    """The direct scan in a process of its own, then one line per stage comparing its limit with batch search's."""
    started = time.perf_counter()
    command = [sys.executable, __file__, "--direct-scan", str(spec_path), "--device", device, "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    path = out / "direct-scan.json"
    if done.returncode != 0 or not path.exists():
        report.line("FAIL", "direct scan", f"exit {done.returncode}: {(done.stdout + done.stderr).strip()[-2000:]}")
        return
    scan = json.loads(path.read_text())
    starts = (f"at the start, search / scan: this process {mb(result.start_bytes)} / {mb(scan['start_bytes'])}, others "
              f"{mb(result.others_at_start_bytes)} / {mb(scan['others_at_start_bytes'])}, allocator cap "
              f"{mb(result.allocator_cap_bytes)} / {mb(scan['allocator_cap_bytes'])}")
    for stage, limits in zip(result.stages, scan["stages"]):
        found, exact = stage.largest_fitting_batch, limits["largest_fitting_batch"]
        report.line("PASS" if agrees(found, exact) else "FAIL", f"direct scan {stage.name}",
                    f"largest fitting batch: scan {exact} (fails at {limits['smallest_failing_batch']}), batch search "
                    f"{found} (fails at {stage.smallest_failing_batch}); {scan['trial_count']} trials in process "
                    f"{scan['pid']}, {seconds:.0f} s; {starts}", scan=str(path))  # fmt: skip


def direct_scan_here(spec_path: Path, out: Path, device: str) -> int:
    """``--direct-scan SPEC``: this process bisects each stage of the spec's batch search by real trials as a worker
    runs batch search (models resident, the same cap and cache rules), and writes direct-scan.json."""
    from rpx_core.api import load_spec
    from rpx_core.execution.context import RunContext, StageContext
    from rpx_core.registry.manager import Plugins
    from rpx_core.spec.plan import make_plan
    from rpx_plugins.batch_search.direct_scan import direct_scan

    spec = with_device(load_spec(spec_path), device)
    plugins = Plugins.load()
    plan = make_plan(spec, plugins)
    backend = plugins.backend(spec.backend)
    for module in backend.worker_preload:  # what rpx's worker processes hold before their first job
        importlib.import_module(module)
    contexts = [StageContext(job, backend, plugins=plugins, gpu_catalog=plan.gpu_catalog) for job in plan.jobs]
    result = direct_scan(RunContext(contexts, plan.options["batch_search"], backend, None, None))
    summary = {
        "pid": os.getpid(),
        "trial_count": result.trial_count,
        "start_bytes": result.start_bytes,
        "others_at_start_bytes": result.others_at_start_bytes,
        "allocator_cap_bytes": result.allocator_cap_bytes,
        "notes": list(result.notes),
        "stages": [{"name": stage.name, "largest_fitting_batch": stage.largest_fitting_batch,
                    "smallest_failing_batch": stage.smallest_failing_batch} for stage in result.stages],
    }  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "direct-scan.json").write_text(json.dumps(summary, indent=2) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheelhouse", type=Path, default=ROOT / "wheelhouse")
    parser.add_argument("--out", type=Path, default=ROOT / "rpx-gpu-check")
    parser.add_argument("--device", choices=("cuda", "mps", "cpu"), default="cuda",
                        help="cpu: with --direct-scan only (the comparison's own logic is tested on the CPU)")
    parser.add_argument("--logic-tests", nargs="*", default=LOGIC_TESTS, help="the CPU logic tests to run")
    parser.add_argument("--only", choices=("batch-search",), help="run this check alone (after the environment)")
    parser.add_argument("--precisions", help="profile at these precisions only (comma-separated; default: every "
                                             "precision the device runs)")
    parser.add_argument("--direct-scan", type=Path, help=argparse.SUPPRESS)  # SPEC: the scan's own process
    args = parser.parse_args(argv)
    if args.direct_scan:
        return direct_scan_here(args.direct_scan, args.out, args.device)
    if args.device == "cpu":
        parser.error("--device cpu is for --direct-scan only")
    args.out.mkdir(parents=True, exist_ok=True)
    report = Report(args.out)
    started = time.perf_counter()
    if not prepare_environment(report, args.wheelhouse, args.out / "site"):
        report.write(ENVIRONMENT)
        return ENVIRONMENT
    present, found = gpu_present(args.device)
    report.line("PASS" if present else "SKIP", "gpu", found)
    if args.only is None:
        pytest_line(report, f"tests needing the device ({args.device})", ["-m", args.device, *DEVICE_TESTS[args.device]],
                    gpu=present)  # fmt: skip
        if args.logic_tests:
            pytest_line(report, "logic tests of the GPU modules", ["-m", "not cuda", *args.logic_tests], gpu=True)
    precisions = tuple(args.precisions.split(",")) if args.precisions else PRECISIONS[args.device]
    if present:
        if args.only is None:
            profile_lines(report, args.out, args.device, precisions)
        batch_search_lines(report, args.out, args.device)
    else:
        skipped = ("batch search", "direct scan")
        if args.only is None:
            skipped = ("profile at " + ", ".join(precisions), "latency vs roofline", *skipped)
        for name in skipped:
            report.line("SKIP", name, "no GPU")
    failed = any(check["status"] == "FAIL" for check in report.checks)
    code = FAILED if failed else (0 if present else NO_GPU)
    report.write(code, device=args.device, gpu=found, seconds=round(time.perf_counter() - started, 1))
    print(f"exit {code} ({'failed' if failed else 'passed' if present else 'no GPU'})", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
