"""GPU checks of the validation work: `rpx backends` on a machine with a CUDA build of torch and a GPU.

On a CPU-only machine the CUDA probe answers from torch's version file; on a GPU machine it must import torch and
ask the driver, which `rpx backends` does in a short-lived process. This script checks, on the real device:

1. the listing's answer for every backend is word for word what the live probe says (cuda: "1 device: NVIDIA H200"),
   and the rpx process that lists them imports neither torch nor jax;
2. a second listing reuses the answers and takes under 0.35x an `import torch` (the figure to record);
3. the name torch reports for the device (torch.cuda.get_device_name) resolves in `rpx gpus` and as a spec's GPU
   (an alias of the pack's entry), and `rpx validate` accepts a cuda spec bounding it.

Run from the repository root: PYTHONPATH=. python3 scripts/gpu_items/validate.py [--cpu]
Prints one PASS/FAIL/SKIP line per check and the figures; exits 1 on a FAIL. About 30 s on an H200 machine.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LISTING = """
import json, sys
from rpx_core.cli import main
main(["backends", "--json", *sys.argv[1:]])
print(json.dumps(sorted(name for name in ("torch", "jax") if name in sys.modules)))
"""
LIVE = """
import json
from rpx_core.registry.manager import Plugins
print(json.dumps({name: [b.availability.available, b.availability.reason]
                  for name, b in Plugins.load().backends().unambiguous().items()}))
"""
FAILED = []


def report(status: str, check: str, detail: str = "") -> None:
    print(f"{status} {check}{': ' + detail if detail else ''}", flush=True)
    if status == "FAIL":
        FAILED.append(check)


def python(code: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=300)


def listing(env: dict[str, str], *args: str) -> tuple[dict[str, list], list[str], float]:
    started = time.perf_counter()
    done = python(LISTING, *args, env=env)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "rpx backends failed")
    rows, _, imported = done.stdout.rpartition("\n[")
    return ({row["name"]: [row["available"], row["reason"]] for row in json.loads(rows)}, json.loads("[" + imported),
            seconds)


def cuda_here(env: dict[str, str]) -> tuple[bool, str | None]:
    done = python("import torch; print(torch.cuda.is_available() and torch.cuda.get_device_name(0) or '')", env=env)
    name = done.stdout.strip() if done.returncode == 0 else ""
    return bool(name), name or None


def main() -> int:
    cpu_only = "--cpu" in sys.argv
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "RPX_CACHE_DIR": folder, "PYTHONPATH": os.pathsep.join(
            [str(Path.cwd()), *filter(None, [os.environ.get("PYTHONPATH")])])}
        has_cuda, device = (False, None) if cpu_only else cuda_here(env)
        live = json.loads(python(LIVE, env=env).stdout)
        first, imported, probing = listing(env, "--refresh")
        same = first == live
        report("PASS" if same else "FAIL", "the listing says what the live probes say",
               "; ".join(f"{name}: {reason}" for name, (_, reason) in sorted(first.items())) if same
               else f"listing {first} != live {live}")
        report("PASS" if imported == [] else "FAIL", "the listing process imports no framework",
               f"imported {imported}" if imported else "neither torch nor jax")
        if has_cuda:
            report("PASS" if first.get("cuda", [False])[0] else "FAIL", "cuda is listed available",
                   first.get("cuda", ["", "no cuda row"])[1])
        else:
            report("SKIP", "cuda is listed available", "no CUDA device here")
        torch_times, cached_times = [], []
        for _ in range(5):
            started = time.perf_counter()
            python("import torch", env=env)
            torch_times.append(time.perf_counter() - started)
            again, _, seconds = listing(env)
            cached_times.append(seconds)
        ratio = statistics.median(cached_times) / statistics.median(torch_times)
        report("PASS" if again == first and ratio < 0.35 else "FAIL", "a second listing reuses the answers, < 0.35x "
               "import torch", f"listing {statistics.median(cached_times) * 1000:.0f} ms, import torch "
               f"{statistics.median(torch_times) * 1000:.0f} ms, ratio {ratio:.2f}; the first (probing) listing "
               f"{probing * 1000:.0f} ms")
        if device is None:
            report("SKIP", "the device's own name resolves as a GPU of the catalogue", "no CUDA device here")
        else:
            check_device_name(device, env, Path(folder))
    return 1 if FAILED else 0


def check_device_name(device: str, env: dict[str, str], folder: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "rpx_core.cli", "gpus", device, "--json"], capture_output=True,
                          text=True, env=env, timeout=120)
    if done.returncode != 0:
        report("FAIL", "the device's own name resolves as a GPU of the catalogue", done.stderr.strip())
        return
    found = json.loads(done.stdout)
    name = found["name"] if isinstance(found, dict) else None
    report("PASS" if name else "FAIL", "the device's own name resolves as a GPU of the catalogue",
           f"{device!r} -> {name}")
    spec = folder / "spec.toml"
    spec.write_text(f'backend = "cuda"\nstages = ["roofline"]\ngpus = [{json.dumps(device)}]\n'
                    '[[models]]\nname = "lin"\nsource = "torch.nn:Linear"\n'
                    'kwargs = {{ in_features = 64, out_features = 64 }}\ninputs = [{{ shape = [8, 64] }}]\n'
                    .replace("{{", "{").replace("}}", "}"))
    done = subprocess.run([sys.executable, "-m", "rpx_core.cli", "validate", str(spec)], capture_output=True,
                          text=True, env=env, timeout=120)
    report("PASS" if done.returncode == 0 else "FAIL", "rpx validate accepts a cuda spec bounding the device by its "
           "own name", done.stdout.strip() or done.stderr.strip())


if __name__ == "__main__":
    sys.exit(main())
