#!/usr/bin/env bash
# Stages the Python package's GPU suite into one folder to carry to a GPU machine: the wheel,
# tests/, tests_gpu/, scripts/ (gpu-run.sh in the folder root), the repository's README.md
# (its Python example is a GPU test) and the real checkpoints (NVFP4_CHECKPOINTS, default
# /work/shared/checkpoints) where present. Then, on the GPU machine: bash DEST/gpu-run.sh
# Usage: stage-gpu.sh DEST WHEEL
set -euo pipefail
[[ $# -eq 2 ]] || { echo "usage: $0 DEST WHEEL" >&2; exit 2; }
dest=$1 wheel=$2
pkg="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$dest"
rm -rf "$dest/tests" "$dest/tests_gpu" "$dest/scripts" "$dest"/*.whl
cp "$wheel" "$dest/"
cp -r "$pkg/tests" "$pkg/tests_gpu" "$pkg/scripts" "$dest/"
cp "$pkg/scripts/gpu-run.sh" "$pkg/../../README.md" "$dest/"
# The real checkpoints the CPU suite's W4A16 tests read (a few MB), where this machine has them.
ckpt=${NVFP4_CHECKPOINTS:-/work/shared/checkpoints}
rm -rf "$dest/checkpoints"
if [[ -d "$ckpt" ]]; then cp -r "$ckpt" "$dest/checkpoints" && chmod -R u+w "$dest/checkpoints"; fi
find "$dest" -name __pycache__ -prune -exec rm -rf {} +
