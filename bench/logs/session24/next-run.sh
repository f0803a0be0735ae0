# Prepared in session 24 for the next session's first run (= .gpu-carry/s25r1.sh), ~4 min, items 1-2;
# item 3 is next-run2.sh (= .gpu-carry/s25r2.sh), ~6 min:
# 1. the issue rate of each instruction kind of the packed decode on one scheduler (pipes.cu);
# 2. ncu's pipe utilization of the packed m256n16 GEMM (8192^2, M = 16) on main's kernels and on
#    the nomma ablation (the decode without wgmma): which pipe, if any, the decode saturates
#    (output cut to the lines that carry figures);
# 3. trim (the raw-stage modulo unsigned: 218 -> 214 SASS instructions per sub-stage of m256n16) and
#    trim2 (+ the shared-memory base checked instead of rounded up, the peer's empty-X barriers
#    mapped once: 204) against main, dense and MoE decode, trim2's bits against main's.
export NVFP4_CACHE_DIR=/tmp/nvfp4-cache; mkdir -p $NVFP4_CACHE_DIR
nvidia-smi -L
nvcc -O3 -arch=sm_90a -o /tmp/pipes bench/logs/session24/pipes.cu 2>&1 | grep -i error
/tmp/pipes
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm --format=csv
python3 -m pip install -q --no-deps --target /tmp/site-x .gpu-carry/py25/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site-x
A=bench/logs/session19/dense_ab.py
# Pipe names this ncu knows (no kernel run), then two profiles per kernel folder: the sections
# (issue slots, warp states, instruction mix) and every per-pipe metric by regex.
ncu --query-metrics --chip gh100 2>/dev/null | grep -E "^(sm__inst_executed_pipe|sm__pipe_)" | awk '{print $1}' | tr '\n' ' '; echo
for v in kv24/main kv26/nomma; do
  echo "== ncu sections $(basename $v) M=16"
  NVFP4_KERNELS_DIR=.gpu-carry/$v timeout 120 ncu --clock-control none -k regex:gemm_w4a16bf16p -s 3 -c 1 \
    --section ComputeWorkloadAnalysis --section WarpStateStats --section InstructionStats --print-details all \
    python3 $A ncu 8192 8192 16 2>&1 | grep -vE "^==PROF==|^\s*$|^\s*-+\s*$" | tail -60
  echo "== ncu pipes $(basename $v) M=16"
  NVFP4_KERNELS_DIR=.gpu-carry/$v timeout 120 ncu --clock-control none -k regex:gemm_w4a16bf16p -s 3 -c 1 \
    --metrics "regex:^sm__(inst_executed_pipe_|pipe_).*" python3 $A ncu 8192 8192 16 2>&1 | grep -E "pct_of_peak|\.sum |ERR|rror" | grep -v " 0$" | head -80
  echo "t=$SECONDS"
done
