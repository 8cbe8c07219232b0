#!/usr/bin/env bash
# Every check this round makes on a GPU, in one run on a node without network, in order of importance, each under
# its own time limit so that one slow item cannot take the others' time:
#
#   bash scripts/gpu_items/run_all.sh WHEELHOUSE [OUT]
#
# WHEELHOUSE holds the wheels of rpx's small dependencies the node's Python lacks (cattrs, tomli-w; see
# scripts/gpu_wheelhouse.sh). Everything printed goes to OUT/run.log too, and the results files of every item into
# OUT/results.tar.gz (default OUT: rpx-gpu-items). Exit status: the number of items that failed or ran out of time.
set -uo pipefail
cd "$(dirname "$0")/../.."
WHEELS=$(realpath "${1:?usage: bash scripts/gpu_items/run_all.sh WHEELHOUSE [OUT]}")
OUT=$(realpath -m "${2:-rpx-gpu-items}")
WORK=$(mktemp -d)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
python3 -m pip install -q --no-deps --target "$WORK/site" "$WHEELS"/*.whl || exit 2
export PYTHONPATH="$WORK/site:$PWD"
item() {  # NAME SECONDS COMMAND...: run COMMAND under a time limit, say how it ended and how long it took
    local name=$1 limit=$2 started=$SECONDS code
    shift 2
    echo "===== $name (limit ${limit} s)"
    timeout -k 10 "$limit" "$@"
    code=$?
    echo "===== $name: exit $code after $((SECONDS - started)) s$([ "$code" = 124 ] && echo ' (out of time)')"
    [ "$code" = 0 ] || failed=$((failed + 1))
}

run_items() {
    local failed=0
    echo "===== machine"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader
    python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__)"
    item gpu-check 200 env RPX_GPU_CHECK_OUT="$WORK/gpu-check" bash scripts/gpu_check.sh "$WHEELS" \
        --logic-tests --precisions fp32,bf16
    item latency 80 python3 scripts/gpu_items/latency.py --out "$WORK/latency"
    item breakdown 80 python3 scripts/gpu_items/breakdown.py --out "$WORK/breakdown"
    item training 90 python3 scripts/gpu_items/training.py
    item serving 60 python3 scripts/gpu_items/serving.py --out "$WORK/serving"
    item run 60 python3 scripts/gpu_items/run.py
    item validate 20 python3 scripts/gpu_items/validate.py
    echo "===== items failed or out of time: $failed"
    return "$failed"
}

run_items 2>&1 | tee "$OUT/run.log"
status=${PIPESTATUS[0]}
tar -czf "$OUT/results.tar.gz" -C "$WORK" --exclude=site . 2>/dev/null
exit "$status"
