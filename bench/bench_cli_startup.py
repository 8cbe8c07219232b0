"""How long `rpx --help`, `rpx plugins`, `rpx gpus` and `rpx backends` take from a cold process, next to bare Python and
`import torch`.

Targets on the reference 2-core machine: `rpx --help`, `rpx plugins` and `rpx gpus` under 0.3 s (none of them may import
torch), and `rpx backends` under 0.35x an `import torch`: its probes run in a short-lived process whose answers are
reused for up to 10 minutes while nothing they depend on changes (rpx_core.registry.availability), so only the first
listing after a change pays for importing the frameworks. That first listing is shown apart (`--refresh`, one run).
Run: python bench/bench_cli_startup.py [repeats]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

from machine import describe_machine

RPX = [sys.executable, "-m", "rpx_core.cli"]
COMMANDS = {
    "python -c pass (floor)": [sys.executable, "-c", "pass"],
    "python -c 'import torch'": [sys.executable, "-c", "import torch"],
    "rpx --help": [*RPX, "--help"],
    "rpx plugins": [*RPX, "plugins"],
    "rpx gpus": [*RPX, "gpus"],
    "rpx backends": [*RPX, "backends"],
}
#: Command -> (limit, what it is a limit of): seconds, or a fraction of `import torch`.
TARGETS = {"rpx --help": (0.3, "s"), "rpx plugins": (0.3, "s"), "rpx gpus": (0.3, "s"),
           "rpx backends": (0.35, "x import torch")}


def seconds(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, env=env)
    return time.perf_counter() - started


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    print(describe_machine())
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "RPX_CACHE_DIR": cache}  # a cold cache: the first listing probes
        # Timed as an installed rpx starts: with its bytecode cached (without it, each start compiles every module
        # again: +0.05-0.15 s here); the --refresh run below writes the cache.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        first = seconds([*RPX, "backends", "--refresh"], env)
        times: dict[str, list[float]] = {name: [] for name in COMMANDS}
        for _ in range(repeats):  # interleaved, so a change in the machine's load touches every command alike
            for name, command in COMMANDS.items():
                times[name].append(seconds(command, env))
    results = {name: statistics.median(values) for name, values in times.items()}
    torch_time = results["python -c 'import torch'"]
    for name, value in results.items():
        ratio = value / torch_time
        verdict = ""
        if name in TARGETS:
            limit, unit = TARGETS[name]
            within = value < limit if unit == "s" else ratio < limit
            verdict = f"  {'OK' if within else 'OVER TARGET'} (< {limit:g} {unit})"
        print(f"{name:<28} median {value * 1000:7.1f} ms  ({ratio:4.2f} x import torch){verdict}")
    print(f"{'rpx backends --refresh':<28} once   {first * 1000:7.1f} ms  ({first / torch_time:4.2f} x import torch)"
          "  probes every backend (the first listing after a change)")


if __name__ == "__main__":
    main()
