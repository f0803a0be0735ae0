# Session 24 run 3: two CTAs per SM for the packed W4A16 GEMM of X tiles <= 32 rows (branch two-cta:
# launch bounds (384, 2), 80 registers, setmaxnreg 40 / 96, the planner's slots doubled), H200.
export NVFP4_CACHE_DIR=/tmp/nvfp4-cache; mkdir -p $NVFP4_CACHE_DIR
nvidia-smi -L
python3 -m pip install -q --no-deps --target /tmp/site-x .gpu-carry/py25/*.whl 2>&1 | tail -2
python3 -m pip install -q --no-deps --target /tmp/site-tc .gpu-carry/py26/*.whl 2>&1 | tail -2
A=bench/logs/session19/dense_ab.py
K=.gpu-carry/kv24
T=.gpu-carry/kv26/tc
PYTHONPATH=/tmp/site-tc NVFP4_KERNELS_DIR=$T timeout 100 python3 $A check 8192 8192 16
PYTHONPATH=/tmp/site-tc NVFP4_KERNELS_DIR=$T timeout 100 python3 $A check 4096 7168 29
echo "t=$SECONDS"
for r in 1 2; do
PYTHONPATH=/tmp/site-x NVFP4_KERNELS_DIR=$K/main timeout 150 python3 $A main 16,32
PYTHONPATH=/tmp/site-tc NVFP4_KERNELS_DIR=$T timeout 150 python3 $A tc 16,32
echo "t=$SECONDS"
done
