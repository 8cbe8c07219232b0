#!/usr/bin/env bash
# Prepare, on a machine WITH network, the wheels the GPU check installs on an offline GPU node:
#
#   bash scripts/gpu_wheelhouse.sh DIR [pip download options]
#
# Downloads scripts/gpu_requirements.txt (rpx's small dependencies and the test tools, with their dependencies;
# never torch or jax) as wheels into DIR. Run it with a Python of the node's version, or name the node's platform:
#   bash scripts/gpu_wheelhouse.sh wheelhouse --python-version 3.11 --platform manylinux2014_x86_64 --only-binary=:all:
# then copy DIR and this checkout to the node and run `bash scripts/gpu_check.sh DIR` there.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:?usage: bash scripts/gpu_wheelhouse.sh DIR [pip download options]}
shift
PY=${PYTHON:-python3}
mkdir -p "$DIR"
"$PY" -m pip download --quiet --dest "$DIR" "$@" -r scripts/gpu_requirements.txt
echo "wheelhouse ready: $DIR ($(ls "$DIR" | wc -l) files)"
