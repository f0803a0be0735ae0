# Prepared in session 23 (second call, if the first leaves the question open): the streaming rate
# alone, session 20's memonly ablation (consumers wait, read, release; no decode, no wgmma) on
# main's layout (mo_main) and on [L][S][G] (mo_sg). M = 16 (m256n16; the memonly m128n256 and
# m256n128 spill dead accumulators, unused here).
export NVFP4_CACHE_DIR=/tmp/nvfp4-cache; mkdir -p $NVFP4_CACHE_DIR
nvidia-smi -L
python3 -m pip install -q --no-deps --target /tmp/site-x .gpu-carry/py25/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site-x
A=bench/logs/session19/dense_ab.py
K=.gpu-carry/kv24
for v in mo_main mo_sg mo_main mo_sg; do NVFP4_KERNELS_DIR=$K/$v timeout 150 python3 $A $v 16; done
echo "t=$SECONDS"
