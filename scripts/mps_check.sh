#!/usr/bin/env bash
# The same check on a Mac with Apple silicon (MPS), prepared without one and never run on Apple hardware yet:
#
#   1. on any machine with network:  bash scripts/gpu_wheelhouse.sh wheelhouse-mac --platform macosx_11_0_arm64 \
#          --python-version 3.11 --only-binary=:all:        (or simply run it on the Mac itself)
#   2. on the Mac, with a Python that has torch (pip install torch: macOS wheels include MPS):
#          bash scripts/mps_check.sh wheelhouse-mac
#
# Runs the MPS tests and logic tests, a profile at fp32, fp16 and bf16 (bf16 needs macOS 14), latency against the
# roofline bound of the Apple GPU rpx recognises, and batch search under an 8 GB budget with a direct scan.
# Exit status as scripts/gpu_check.sh (3: no MPS device).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${RPX_GPU_PYTHON:-python3}
sw_vers 2>/dev/null || uname -srm
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
exec "$PY" scripts/gpu_check.py --wheelhouse "${1:-wheelhouse}" --out "${RPX_GPU_CHECK_OUT:-rpx-mps-check}" --device mps "${@:2}"
