# Session 24 run 4: where main's time goes on the H200 (packed W4A16 GEMM): memonly (no decode, no
# wgmma), none (wgmma on the raw words, no decode), nomma (the decode, no wgmma: fragments XORed
# into one accumulator), main's kernels (f1e01f4) before and after.
export NVFP4_CACHE_DIR=/tmp/nvfp4-cache; mkdir -p $NVFP4_CACHE_DIR
nvidia-smi -L
python3 -m pip install -q --no-deps --target /tmp/site-x .gpu-carry/py25/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site-x
A=bench/logs/session19/dense_ab.py
for v in kv24/main kv24/mo_main kv26/none kv26/nomma kv24/main; do NVFP4_KERNELS_DIR=.gpu-carry/$v timeout 150 python3 $A $(basename $v) 16,64; echo "t=$SECONDS"; done
