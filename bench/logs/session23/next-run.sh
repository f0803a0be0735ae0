# Prepared in session 23 for the next session's first run: the packed form in the layout
# [L][S][G] (branch layout-sg: a stage of a tile's row groups one run; the CTAs streaming the same
# stages read one window) against main's [L][G][S]; sg_a4 = sg + the L2 prefetch 4 stages ahead;
# qx (last): the cost of quantizing X inside the packed GEMM.
# Kernel folders carry both the device packer and the GEMMs (Python packs on the GPU).
export NVFP4_CACHE_DIR=/tmp/nvfp4-cache; mkdir -p $NVFP4_CACHE_DIR
nvidia-smi -L
python3 -m pip install -q --no-deps --target /tmp/site-x .gpu-carry/py25/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site-x
A=bench/logs/session19/dense_ab.py
D=bench/logs/session23/moe_decode16.py
K=.gpu-carry/kv24
NVFP4_KERNELS_DIR=$K/sg timeout 100 python3 $A check 8192 8192 16
NVFP4_KERNELS_DIR=$K/sg timeout 100 python3 $A check 4096 7168 29
echo "t=$SECONDS"
for v in main sg sg_a4 main sg; do NVFP4_KERNELS_DIR=$K/$v timeout 150 python3 $A $v 16,32,64,128; done
echo "t=$SECONDS"
for v in main sg; do NVFP4_KERNELS_DIR=$K/$v timeout 150 python3 $D $v; echo "t=$SECONDS"; done
# qx: main's kernels + warps 2-3 quantizing each X sub-stage in shared memory (the cost of a
# fused W4A4 quantization; values not the library's), M <= 64 only (it re-quantizes X per W tile).
for v in qx main qx; do NVFP4_KERNELS_DIR=$K/$v timeout 150 python3 $A $v 16,32,64; done
echo "t=$SECONDS"
