"""``rpx backends`` imports no framework into rpx's process: its probes run in a short-lived process, and their
answers, word for word the probes' own, are reused while fresh and while nothing they depend on changed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from rpx_core.registry.manager import Plugins

LISTING = """
import json, sys
from rpx_core.cli import main
main(["backends", "--json", *sys.argv[1:]])
print(json.dumps(sorted(name for name in ("torch", "jax") if name in sys.modules)))
"""


def listing(tmp_path: Path, *args: str, **env: str) -> tuple[list[dict], list[str]]:
    done = subprocess.run([sys.executable, "-c", LISTING, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "RPX_CACHE_DIR": str(tmp_path / "cache"), **env})
    assert done.returncode == 0, done.stderr
    rows, _, imported = done.stdout.rpartition("\n[")
    return json.loads(rows), json.loads("[" + imported)


def test_the_listing_says_what_the_probes_say_and_imports_no_framework(tmp_path: Path) -> None:
    live = {name: backend.availability for name, backend in Plugins.load().backends().unambiguous().items()}
    first, imported = listing(tmp_path)
    assert imported == []  # neither torch nor jax, even when it probes
    assert {row["name"]: (row["available"], row["reason"]) for row in first} == {
        name: (found.available, found.reason) for name, found in live.items()}
    assert {row["probed_seconds_ago"] for row in first} == {0.0}

    again, imported = listing(tmp_path)
    assert imported == [] and [(r["name"], r["reason"]) for r in again] == [(r["name"], r["reason"]) for r in first]
    assert all(row["probed_seconds_ago"] >= 0 for row in again)
    assert (tmp_path / "cache" / "backends.json").is_file()


def test_a_changed_device_variable_or_refresh_probes_again(tmp_path: Path) -> None:
    listing(tmp_path)
    cache = tmp_path / "cache" / "backends.json"
    stored = json.loads(cache.read_text())
    stored["backends"]["cpu"][1] = "a stale answer"  # what a reused answer would show
    cache.write_text(json.dumps(stored))
    reused, _ = listing(tmp_path)
    assert next(row for row in reused if row["name"] == "cpu")["reason"] == "a stale answer"
    old = {**stored, "probed_at": stored["probed_at"] - 601}  # older than the 10 minutes answers are kept
    for args, env, written in (((), {"CUDA_VISIBLE_DEVICES": "7"}, stored), (("--refresh",), {}, stored), ((), {}, old)):
        cache.write_text(json.dumps(written))
        probed, _ = listing(tmp_path, *args, **env)
        assert next(row for row in probed if row["name"] == "cpu")["reason"] == "torch on the host CPU"
