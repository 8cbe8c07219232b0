#!/usr/bin/env bash
# The prepared check for a lent NVIDIA GPU machine (about 2-4 minutes), everything printed to stdout:
#   1. a Python environment with rpx installed (reuses a CUDA-enabled torch already on the machine: the device machine
#      has no internet, so nothing large is downloaded; set RPX_GPU_PYTHON to choose the interpreter),
#   2. the CUDA tests (pytest -m cuda) and the CPU logic tests of the same modules,
#   3. a real profile of specs/gpu_check.toml on cuda:0 at fp16 and bf16 (scripts/gpu_check.py).
# Usage: bash scripts/gpu_check.sh     Exit status: non-zero if any step failed (every step still runs).
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
step() { echo; echo "===== $* ====="; }

step "machine"
nvidia-smi || echo "nvidia-smi not found"
uname -a

step "python environment"
BASE_PYTHON=${RPX_GPU_PYTHON:-python3}
VENV=${RPX_GPU_VENV:-/tmp/rpx-gpu-venv}  # an existing environment to use, or where to create one (outside the checkout)
if [ ! -x "$VENV/bin/python" ]; then
    # --system-site-packages: reuse the machine's CUDA torch, numpy, pytest instead of downloading them.
    "$BASE_PYTHON" -m venv --system-site-packages "$VENV" || { echo "cannot create $VENV"; exit 2; }
fi
PY="$VENV/bin/python"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # rpx runs from the checkout even if the editable install fails
"$PY" -m pip install --quiet --no-deps -e . 2>/dev/null || "$PY" -m pip install --quiet --no-build-isolation --no-deps -e . \
    || echo "pip install -e . failed (no package index and no wheel package?): running rpx from PYTHONPATH instead"
# rpx's own small dependencies: present already, or fetched if the machine can reach a package index.
"$PY" -c "import pluggy, attrs, cattrs, psutil, tomli_w, numpy, pytest, hypothesis" 2>/dev/null \
    || "$PY" -m pip install --quiet pluggy attrs cattrs psutil tomli-w numpy pytest hypothesis \
    || { echo "rpx's dependencies are missing and could not be installed"; status=1; }
"$PY" -c "import pynvml" 2>/dev/null && echo "nvidia-ml-py: installed" \
    || { "$PY" -m pip install --quiet nvidia-ml-py 2>/dev/null && echo "nvidia-ml-py: installed now"; } \
    || echo "nvidia-ml-py: not available (driver version, clocks and power limits will be listed as gaps)"
"$PY" - <<'PYEOF' || status=1
import torch
print("torch", torch.__version__, "CUDA", torch.version.cuda, "cuDNN", torch.backends.cudnn.version())
print("cuda available:", torch.cuda.is_available(), "devices:", [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
assert torch.cuda.is_available(), "torch cannot see a CUDA device"
PYEOF
"$PY" -m rpx_core.cli backends || status=1

step "tests: CUDA (pytest -m cuda) and the CPU logic of the same modules"
timeout 180 "$PY" -m pytest -q -rs -m cuda tests/test_cuda_backend.py tests/test_system_card.py || status=1
timeout 180 "$PY" -m pytest -q -rs tests/test_cuda_backend.py tests/test_system_card.py tests/test_latency.py \
    tests/test_stats.py tests/test_host_memory.py || status=1

step "profile specs/gpu_check.toml on cuda:0 at fp16 and bf16, then batch search under an 8 GB budget"
timeout 240 "$PY" scripts/gpu_check.py || status=1

step "done: status $status"
exit $status
