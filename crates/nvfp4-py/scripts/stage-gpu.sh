#!/usr/bin/env bash
# Stages the Python package's GPU suite into one folder to carry to a GPU machine: the wheel,
# tests/, tests_gpu/, scripts/ (gpu-run.sh in the folder root) and the repository's README.md
# (its Python example is a GPU test). Then, on the GPU machine: bash DEST/gpu-run.sh
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
find "$dest" -name __pycache__ -prune -exec rm -rf {} +
