#!/usr/bin/env bash
# The GPU check: one script that a machine with a CUDA device runs from a copy of the repository
# in under 8 minutes, and that runs anywhere else with its GPU parts skipped and saying so:
#
#   1. the CUDA tests (tests/test_cuda.py: every family's learner and actor inference on the GPU);
#   2. benchmarks/gpu_check.py: each family's learner env steps/s on the GPU in fp32 (TF32) and
#      bf16 beside the same on the CPU, and the actors' batched inference with 32 actor processes
#      on the GPU beside one actor on the CPU (one table);
#   3. a short Pong run (configs/impala_pong.yaml, the learner and the actors on the GPU, 8 actors,
#      PONG_S seconds, 120 by default) with the launcher, its last record printed.
#
# Packages the machine lacks (pyzmq, lz4, msgpack, gymnasium, ale-py, ...) travel as wheels in
# .whl/ at the repository's root, installed into /tmp/site when that folder exists. Figures and
# logs go to $OUT (or /tmp/gpu_check).
#
#     bash benchmarks/gpu_check.sh [gpu_check.py's arguments: --seconds S --families F ...]
#
# The wheels for .whl/ (a Python 3.12 x86-64 Linux machine), on a machine that reaches PyPI:
#
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#         --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#         --platform manylinux2014_x86_64 -d .whl pyzmq msgpack lz4 gymnasium \
#         farama-notifications ale-py optuna
set -u
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu_check}
mkdir -p "$out"
python=${PYTHON:-python3}
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
status=0

if "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    cuda=1
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
else
    cuda=0
    echo "no CUDA device: the GPU parts are skipped, the CPU figures still measured"
fi

echo "== 1. CUDA tests"
if [ "$cuda" = 1 ]; then
    timeout 240 "$python" -m pytest -q -p no:cacheprovider tests/test_cuda.py 2>&1 \
        | tee "$out/cuda_tests.log" | tail -5
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
else
    echo "skipped: no CUDA device"
fi

echo "== 2. learner and actors, GPU beside CPU"
timeout 360 "$python" benchmarks/gpu_check.py --json "$out/gpu_check.json" "$@" || status=1

echo "== 3. a short Pong run on the GPU"
if [ "$cuda" = 0 ]; then
    echo "skipped: no CUDA device"
elif ! "$python" -c "import ale_py" 2>/dev/null; then
    echo "skipped: ale-py is not installed (carry its wheel in .whl/)"
else
    run_dir=$(mktemp -d /tmp/gpu_check_pong.XXXXXX)
    timeout $((${PONG_S:-120} + 120)) bash scripts/launch_local.sh --actors 8 --learners 1 \
        --config configs/impala_pong.yaml --run-dir "$run_dir/run" \
        --set learner.device=cuda --set actor.device=cuda \
        --set "run.stop_wall_s=${PONG_S:-120}" >"$out/pong.log" 2>&1 || status=1
    tail -3 "$out/pong.log"
    tail -1 "$run_dir/run/result.json" 2>/dev/null | "$python" -c "
import json, sys
r = json.loads(sys.stdin.read())
print('pong after', r['time_s'], 's:', r['env_steps'], 'env steps,', r['env_steps_per_s'],
      'env steps/s,', r['updates_per_s'], 'updates/s, training return', r['episode_return_mean'])" || status=1
fi
exit $status
