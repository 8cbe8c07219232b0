#!/usr/bin/env bash
# The GPU check on a node with an NVIDIA GPU, no network, and a Python that already has torch built for CUDA:
#
#   bash scripts/gpu_check.sh [WHEELHOUSE]        (default: ./wheelhouse, made by scripts/gpu_wheelhouse.sh)
#
# Uses that Python as it is (RPX_GPU_PYTHON, default python3): torch and jax are never installed or replaced; rpx and
# whatever small dependency is missing go into a private folder on PYTHONPATH (RPX_GPU_CHECK_OUT/site). Prints one
# PASS/FAIL/SKIP line per check and writes RPX_GPU_CHECK_OUT/gpu-check.json (default ./rpx-gpu-check).
# Exit status: 0 passed, 1 a check failed, 2 the environment could not be prepared, 3 no GPU (see scripts/gpu_check.py).
# Further arguments go to scripts/gpu_check.py (e.g. --logic-tests FILE... to run fewer logic tests, or
# --only batch-search for batch search and its direct scan alone: about a minute of the device's time).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${RPX_GPU_PYTHON:-python3}
echo "===== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not found"
uname -srm
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1  # offline: pip only ever reads the wheelhouse
exec "$PY" scripts/gpu_check.py --wheelhouse "${1:-wheelhouse}" --out "${RPX_GPU_CHECK_OUT:-rpx-gpu-check}" --device cuda "${@:2}"
