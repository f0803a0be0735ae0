#!/usr/bin/env bash
# The GPU suite, run ON the GPU machine from the repository root with gpu-bin/ built by
# scripts/build-gpu.sh. Every step runs even when an earlier one fails; the exit status is
# non-zero if any step failed. Logs go to $OUT (default ./gpu-out): one log per step,
# bench.json, and summary.txt (the table printed at the end). Few files on purpose: the device
# tool returns at most 8.
#
# Steps (GPU_SUITE_STEPS selects a subset, e.g. "env tests"):
#   env        nvidia-smi, NVRTC discovery, `nvfp4 kernels` (registers/spills on this NVRTC)
#   tests      gpu-bin/test-* with --ignored, on cargo's default test threads (TEST_BINS="cuda bench" picks
#              binaries, default all; TEST_FILTER passes test-name filters).
#   check      nvfp4 check --backend cuda, one step per mode (--mode w4a4, --mode w4a16)
#   bench      nvfp4 bench --json $OUT/bench.json (SPEC §7 cold protocol)
#   graph      nvfp4 bench --mode graph --json $OUT/bench-graph.json (SPEC §7 graph protocol)
#   large      nvfp4 bench gemm --shapes large --json $OUT/bench-large.json
#   sanitizer  compute-sanitizer memcheck (small GEMV/grouped cases, the GEMM, dual GEMM and grouped
#              GEMM small sweeps, every operation bound inside a capture on a side stream), racecheck (SPEC GEMV shapes incl. split-K; a small GEMM and dual
#              case on split-K, stream-K and pairs; the grouped sweep with empty experts) and
#              synccheck (SPEC GEMV shapes)
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
OUT=${OUT:-$root/gpu-out}
mkdir -p "$OUT"
BIN=${BIN:-$root/gpu-bin}
STEPS=${GPU_SUITE_STEPS:-env tests check bench sanitizer}
STEP_TIMEOUT=${STEP_TIMEOUT:-900}
export NVFP4_CACHE_DIR=${NVFP4_CACHE_DIR:-/tmp/nvfp4-cache}
export RUST_BACKTRACE=1

# NVRTC: the CUDA toolkit's, or a pip wheel's (nvidia-cuda-nvrtc), whichever is found first.
find_nvrtc_dir() {
  local cands=("${NVRTC_LIB_DIR:-}" /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib)
  local sp
  for sp in $(python3 -c 'import site, sys; print(" ".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null); do
    cands+=("$sp/nvidia/cu13/lib" "$sp/nvidia/cuda_nvrtc/lib")
  done
  local d
  for d in "${cands[@]}"; do
    [[ -n "$d" ]] && compgen -G "$d/libnvrtc.so*" >/dev/null && { echo "$d"; return 0; }
  done
  ldconfig -p 2>/dev/null | awk '/libnvrtc\.so/ {print $NF; exit}' | xargs -r dirname
}
nvrtc_dir=$(find_nvrtc_dir)
if [[ -n "$nvrtc_dir" ]]; then
  export LD_LIBRARY_PATH="$nvrtc_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# cuBLASLt (the bench's peer): the toolkit keeps it under targets/, off the loader path.
cublaslt=$(find /usr/local/cuda*/targets/x86_64-linux/lib /usr/local/cuda/lib64 -maxdepth 1 -name 'libcublasLt.so*' 2>/dev/null | head -n1)
if [[ -n "$cublaslt" ]]; then
  export LD_LIBRARY_PATH="$(dirname "$cublaslt"):$LD_LIBRARY_PATH"
fi

declare -a names=() statuses=() secs=() logs=()
failed=0

# run_step NAME LOG COMMAND...: runs COMMAND with a timeout, output appended to LOG.
run_step() {
  local name=$1 log=$2
  shift 2
  echo "=== $name: $*" | tee -a "$log"
  local t0=$SECONDS
  timeout "$STEP_TIMEOUT" "$@" >>"$log" 2>&1
  local rc=$?
  local status=PASS
  ((rc == 0)) || { status="FAIL(rc=$rc)"; failed=1; }
  ((rc == 124)) && status="FAIL(timeout)"
  names+=("$name") statuses+=("$status") secs+=($((SECONDS - t0))) logs+=("$(basename "$log")")
  echo "=== $name: $status in $((SECONDS - t0)) s" | tee -a "$log"
  tail -n 25 "$log"
}

skip_step() {
  names+=("$1") statuses+=("SKIP") secs+=(0) logs+=("-")
  echo "=== $1: SKIP ($2)"
}

has_step() { [[ " $STEPS " == *" $1 "* ]]; }

if [[ ! -x "$BIN/nvfp4" ]]; then
  echo "no $BIN/nvfp4: run scripts/build-gpu.sh on the build machine and carry gpu-bin" >&2
  exit 2
fi
cat "$BIN/REVISION" 2>/dev/null | head -n1 | sed 's/^/revision: /'

if has_step env; then
  log="$OUT/env.log"
  : >"$log"
  run_step nvidia-smi "$log" nvidia-smi
  echo "NVRTC: ${nvrtc_dir:-not found}" | tee -a "$log"
  run_step kernels "$log" "$BIN/nvfp4" kernels
fi

if has_step tests; then
  log="$OUT/tests.log"
  : >"$log"
  for t in "$BIN"/test-*; do
    [[ -x "$t" ]] || continue
    if [[ -n "${TEST_BINS:-}" && " $TEST_BINS " != *" ${t##*/test-} "* ]]; then continue; fi
    # shellcheck disable=SC2086
    run_step "$(basename "$t") --ignored" "$log" "$t" --ignored --nocapture \
      ${TEST_FILTER:-}
  done
fi

if has_step check; then
  log="$OUT/check.log"
  : >"$log"
  if "$BIN/nvfp4" check --help 2>/dev/null | grep -q -- '--mode'; then
    # One step per mode: a W4A16 case no kernel takes yet fails its own step, not W4A4's.
    run_step "check --backend cuda --mode w4a4" "$log" "$BIN/nvfp4" check --backend cuda --mode w4a4
    run_step "check --backend cuda --mode w4a16" "$log" "$BIN/nvfp4" check --backend cuda --mode w4a16
  elif "$BIN/nvfp4" check --help 2>/dev/null | grep -q -- '--backend'; then
    run_step "check --backend cuda" "$log" "$BIN/nvfp4" check --backend cuda
  else
    skip_step "check --backend cuda" "this nvfp4 check has no --backend option yet"
  fi
fi

if has_step bench; then
  log="$OUT/bench.log"
  : >"$log"
  if "$BIN/nvfp4" bench --help 2>/dev/null | grep -q -- '--json'; then
    run_step "bench" "$log" "$BIN/nvfp4" bench --json "$OUT/bench.json"
  else
    skip_step "bench" "this nvfp4 has no bench subcommand"
  fi
fi

if has_step graph; then
  log="$OUT/bench-graph.log"
  : >"$log"
  run_step "bench --mode graph" "$log" "$BIN/nvfp4" bench --mode graph --json "$OUT/bench-graph.json"
fi

if has_step large; then
  log="$OUT/bench-large.log"
  : >"$log"
  run_step "bench gemm --shapes large" "$log" "$BIN/nvfp4" bench gemm --shapes large \
    --json "$OUT/bench-large.json"
fi

if has_step sanitizer; then
  log="$OUT/sanitizer.log"
  : >"$log"
  if command -v compute-sanitizer >/dev/null && [[ -x "$BIN/test-cuda" ]]; then
    run_step "memcheck (small GEMV, grouped)" "$log" compute-sanitizer --tool memcheck --error-exitcode 1 \
      "$BIN/test-cuda" --ignored --test-threads=1 gemv_alpha_nan_and_mixed_layouts grouped_gemm_bit_exact \
      gemv_spec_tests_bit_exact
    # The SPEC GEMV shapes include split-K ones (shared memory staging + cross-CTA fixup).
    run_step "racecheck (SPEC GEMV incl. split-K)" "$log" compute-sanitizer --tool racecheck --error-exitcode 1 \
      "$BIN/test-cuda" --ignored --test-threads=1 gemv_spec_tests_bit_exact
    run_step "synccheck (SPEC GEMV)" "$log" compute-sanitizer --tool synccheck --error-exitcode 1 \
      "$BIN/test-cuda" --ignored --test-threads=1 gemv_spec_tests_bit_exact
    if [[ -x "$BIN/test-cuda_gemm" ]]; then
      run_step "memcheck (wgmma GEMM small sweep)" "$log" compute-sanitizer --tool memcheck --error-exitcode 1 \
        "$BIN/test-cuda_gemm" --ignored --test-threads=1 gemm_sm90_sanitizer_sweep
      run_step "racecheck (wgmma GEMM small case)" "$log" compute-sanitizer --tool racecheck --error-exitcode 1 \
        "$BIN/test-cuda_gemm" --ignored --test-threads=1 gemm_sm90_racecheck_case
      run_step "memcheck (fallback GEMM forced)" "$log" compute-sanitizer --tool memcheck --error-exitcode 1 \
        "$BIN/test-cuda_gemm" --ignored --test-threads=1 gemm_fallback_forced_bit_exact
    fi
    if [[ -x "$BIN/test-cuda_small" ]]; then
      run_step "memcheck (small GEMM edges)" "$log" compute-sanitizer --tool memcheck --error-exitcode 1 \
        "$BIN/test-cuda_small" --ignored --test-threads=1 small_gemm_bit_exact_every_edge
      run_step "racecheck (small GEMM edges)" "$log" compute-sanitizer --tool racecheck --error-exitcode 1 \
        "$BIN/test-cuda_small" --ignored --test-threads=1 small_gemm_bit_exact_every_edge
    fi
    if [[ -x "$BIN/test-cuda_dual" ]]; then
      run_step "memcheck (dual GEMM small sweep)" "$log" compute-sanitizer --tool memcheck --error-exitcode 1 \
        "$BIN/test-cuda_dual" --ignored --test-threads=1 dual_sm90_sanitizer_sweep
      run_step "racecheck (dual GEMM small case)" "$log" compute-sanitizer --tool racecheck --error-exitcode 1 \
        "$BIN/test-cuda_dual" --ignored --test-threads=1 dual_sm90_racecheck_case
    fi
    if [[ -x "$BIN/test-cuda_streams" ]]; then
      run_step "memcheck (calls bound in a capture on a side stream)" "$log" compute-sanitizer --tool memcheck \
        --error-exitcode 1 "$BIN/test-cuda_streams" --ignored --test-threads=1 calls_bound_inside_a_capture
    fi
    if [[ -x "$BIN/test-cuda_grouped" ]]; then
      run_step "memcheck (grouped GEMM small sweep)" "$log" compute-sanitizer --tool memcheck --error-exitcode 1 \
        "$BIN/test-cuda_grouped" --ignored --test-threads=1 grouped_sm90_sanitizer_sweep
      run_step "racecheck (grouped GEMM small sweep)" "$log" compute-sanitizer --tool racecheck --error-exitcode 1 \
        "$BIN/test-cuda_grouped" --ignored --test-threads=1 grouped_sm90_sanitizer_sweep
    fi
  else
    skip_step "compute-sanitizer" "compute-sanitizer or gpu-bin/test-cuda missing"
  fi
fi

{
  echo
  echo "GPU suite summary ($(date -u +%FT%TZ), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1))"
  printf '%-40s %-16s %6s  %s\n' step status seconds log
  for i in "${!names[@]}"; do
    printf '%-40s %-16s %6s  %s\n' "${names[$i]}" "${statuses[$i]}" "${secs[$i]}" "${logs[$i]}"
  done
  ((failed)) && echo "RESULT: FAIL" || echo "RESULT: PASS"
} | tee "$OUT/summary.txt"
exit "$failed"
