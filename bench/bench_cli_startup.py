"""How long `rpx --help`, `rpx plugins` and `rpx gpus` take from a cold process, next to bare Python and `import torch`.

Target: each of those three under 0.3 s on the reference 2-core machine, because none of them may import torch.
`rpx backends` is shown for information only: it probes each runtime (CUDA needs torch imported, JAX needs jax).
Run: python bench/bench_cli_startup.py [repeats]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

from machine import describe_machine

COMMANDS = {
    "python -c pass (floor)": [sys.executable, "-c", "pass"],
    "python -c 'import torch'": [sys.executable, "-c", "import torch"],
    "rpx --help": [sys.executable, "-m", "rpx_core.cli", "--help"],
    "rpx plugins": [sys.executable, "-m", "rpx_core.cli", "plugins"],
    "rpx backends": [sys.executable, "-m", "rpx_core.cli", "backends"],
    "rpx gpus": [sys.executable, "-m", "rpx_core.cli", "gpus"],
}


def median_seconds(command: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    print(describe_machine())
    results = {name: median_seconds(command, repeats) for name, command in COMMANDS.items()}
    torch_time = results["python -c 'import torch'"]
    for name, seconds in results.items():
        targeted = name in ("rpx --help", "rpx plugins", "rpx gpus")
        verdict = "" if not targeted else ("  OK (< 0.3 s)" if seconds < 0.3 else "  OVER TARGET")
        print(f"{name:<28} median {seconds * 1000:7.1f} ms  ({seconds / torch_time:4.2f} x import torch){verdict}")


if __name__ == "__main__":
    main()
