# Session 24 run 5: the bf16 packed decode's shifts and rotates as IMAD / IMAD.WIDE (FMA pipe)
# instead of SHF (ALU pipe): kv26/imad = main's kernels (kv24/main, f1e01f4) + that change, H200.
export NVFP4_CACHE_DIR=/tmp/nvfp4-cache; mkdir -p $NVFP4_CACHE_DIR
nvidia-smi -L
python3 -m pip install -q --no-deps --target /tmp/site-x .gpu-carry/py25/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site-x
A=bench/logs/session19/dense_ab.py
D=bench/logs/session23/moe_decode16.py
NVFP4_KERNELS_DIR=.gpu-carry/kv26/imad timeout 100 python3 $A check 8192 8192 16
NVFP4_KERNELS_DIR=.gpu-carry/kv26/imad timeout 100 python3 $A check 4096 7168 29
B=bench/logs/session24/bits_ab.py
for v in kv24/main kv26/imad; do NVFP4_KERNELS_DIR=.gpu-carry/$v timeout 120 python3 $B save /tmp/bits_$(basename $v).pt; done
python3 $B cmp /tmp/bits_main.pt /tmp/bits_imad.pt
echo "t=$SECONDS"
for v in kv24/main kv26/imad kv24/main kv26/imad; do NVFP4_KERNELS_DIR=.gpu-carry/$v timeout 150 python3 $A $(basename $v) 16,32,64,128; echo "t=$SECONDS"; done
for v in kv26/imad kv24/main; do NVFP4_KERNELS_DIR=.gpu-carry/$v timeout 150 python3 $D $(basename $v); echo "t=$SECONDS"; done
