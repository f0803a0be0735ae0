#!/usr/bin/env bash
# Nsight Compute profile of one wgmma GEMM launch, run ON the GPU machine with gpu-bin/ built by
# scripts/build-gpu.sh:  scripts/gpu-profile.sh MxNxK [cfg]   (cfg: an NVFP4_GEMM_SM90 value)
# Writes to $OUT (default ./gpu-out): ncu-details.txt (every section of the full set) and
# ncu-source.csv (per-SASS-instruction executions and warp-stall samples), small enough for the
# device tool to return. Clocks are left to the GPU (--clock-control none), as in the bench.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
OUT=${OUT:-$root/gpu-out}
mkdir -p "$OUT"
BIN=${BIN:-$root/gpu-bin}
export NVFP4_CACHE_DIR=${NVFP4_CACHE_DIR:-/tmp/nvfp4-cache}
shape=${1:?usage: gpu-profile.sh MxNxK [cfg]}
cfg=${2:-auto}

for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  compgen -G "$d/libnvrtc.so*" >/dev/null && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" && break
done
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -n1)
rep=/tmp/nvfp4-profile
# The first launch is the bit-exact check, the second the warm-up: profile the third.
"$ncu" --set full --import-source no --clock-control none --kernel-name regex:gemm_nvfp4_sm90 \
  --launch-skip 2 --launch-count 1 -f -o "$rep" "$BIN/dev_gemm_diag" profile "$shape" "$cfg" | tail -n 5
"$ncu" -i "$rep.ncu-rep" --page details >"$OUT/ncu-details.txt"
"$ncu" -i "$rep.ncu-rep" --page source --csv --print-source sass >"$OUT/ncu-source.csv" ||
  echo "source page export failed" >>"$OUT/ncu-details.txt"
wc -c "$OUT"/ncu-*
