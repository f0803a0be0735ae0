# Prepared in session 24, the next session's second call (= .gpu-carry/s25r2.sh), ~6 min: item 3 of
# next-run.sh.
export NVFP4_CACHE_DIR=/tmp/nvfp4-cache; mkdir -p $NVFP4_CACHE_DIR
nvidia-smi -L
python3 -m pip install -q --no-deps --target /tmp/site-x .gpu-carry/py25/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site-x
A=bench/logs/session19/dense_ab.py
for v in kv24/main kv26/trim kv26/trim2 kv24/main kv26/trim kv26/trim2; do NVFP4_KERNELS_DIR=.gpu-carry/$v timeout 150 python3 $A $(basename $v) 16,64; echo "t=$SECONDS"; done
B=bench/logs/session24/bits_ab.py
for v in kv24/main kv26/trim2; do NVFP4_KERNELS_DIR=.gpu-carry/$v timeout 120 python3 $B save /tmp/bits_$(basename $v).pt; done
python3 $B cmp /tmp/bits_main.pt /tmp/bits_trim2.pt
for v in kv26/trim2 kv24/main; do NVFP4_KERNELS_DIR=.gpu-carry/$v timeout 150 python3 bench/logs/session23/moe_decode16.py $(basename $v); echo "t=$SECONDS"; done
