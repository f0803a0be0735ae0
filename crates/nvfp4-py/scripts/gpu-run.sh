#!/usr/bin/env bash
# Runs the Python package's GPU suite from a folder holding the wheel, tests/, tests_gpu/,
# scripts/, README.md and optionally checkpoints/ (staged by scripts/stage-gpu.sh next to a wheel
# built by maturin), on a machine with torch and a GPU; logs to $OUT.
set -uo pipefail
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/nvfp4-py-out}
mkdir -p "$OUT"
export NVFP4_CACHE_DIR=${NVFP4_CACHE_DIR:-/tmp/nvfp4-cache}
site=/tmp/nvfp4-site
python3 -m pip install --quiet --no-deps --target "$site" ./*.whl 2>&1 | tail -3
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi -L | tee "$OUT/gpu.txt"
python3 -c 'import torch, sys; print("torch", torch.__version__, "python", sys.version.split()[0])' | tee -a "$OUT/gpu.txt"
[[ -d checkpoints ]] && export NVFP4_CHECKPOINTS="$PWD/checkpoints"
status=0
(cd tests_gpu && timeout 480 python3 -m pytest -q -rA -p no:cacheprovider . ../tests) 2>&1 | tee "$OUT/pytest.log" | tail -40
status=$((status | ${PIPESTATUS[0]}))
timeout 60 python3 scripts/host_cost.py 2>&1 | tee "$OUT/host_cost.jsonl"
timeout 60 python3 scripts/bench_quantize.py 2>&1 | tee "$OUT/bench_quantize.jsonl"
exit $status
