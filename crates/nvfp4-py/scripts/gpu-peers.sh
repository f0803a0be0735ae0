#!/usr/bin/env bash
# The peer bench (scripts/bench_peers.py) on the GPU machine, which has torch, triton and no
# network. Installs the nvfp4 wheel given as the first argument and the carried peer wheels into
# one --target folder (humming-kernels always; cuda-bindings, cuda-pathfinder, jinja2, markupsafe
# and tabulate only where python3 cannot import them already), then runs the bench with the other
# arguments. Leaves under $OUT (default /tmp/nvfp4-peers-out): <card>-peers.json (rewritten after
# every case), peers.log and env.txt.
#
# Usage: gpu-peers.sh WHEEL [bench_peers.py arguments, e.g. --quick or --only dense]
#   PEERS_WHEELS   folder of the carried wheels (default <repo>/.gpu-carry/peers-wheels)
#   PEERS_BUDGET   seconds after which no new case starts (default 420)
#   PEERS_TIMEOUT  hard limit of the bench in seconds (default 560; the device tool stops a command
#                  at 600)
set -uo pipefail
[[ $# -ge 1 ]] || { echo "usage: $0 WHEEL [bench_peers.py arguments]" >&2; exit 2; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../../.." && pwd)
wheel=$1
shift
OUT=${OUT:-/tmp/nvfp4-peers-out}
mkdir -p "$OUT"
wheels=${PEERS_WHEELS:-$root/.gpu-carry/peers-wheels}
site=/tmp/nvfp4-peers-site
export NVFP4_CACHE_DIR=${NVFP4_CACHE_DIR:-/tmp/nvfp4-cache}
export HUMMING_CACHE_DIR=${HUMMING_CACHE_DIR:-/tmp/humming-cache}
export PYTHONUNBUFFERED=1

peers=("$wheels"/humming_kernels-*.whl)
# module:wheel-name prefix of each dependency of humming-kernels the machine may lack
for dep in cuda.bindings:cuda_bindings cuda.pathfinder:cuda_pathfinder jinja2:jinja2 markupsafe:markupsafe tabulate:tabulate; do
  mod=${dep%%:*} name=${dep#*:}
  if ! python3 -c "import $mod" 2>/dev/null; then
    peers+=("$wheels"/"$name"-*.whl)
  fi
done
pip_install() { python3 -m pip install --quiet --no-index --no-deps --no-cache-dir --find-links "$wheels" --target "$site" "$@"; }
# Reinstalling would give Humming's headers new mtimes, which its kernel cache keys on: on a machine
# still warm from an earlier run with the same wheels, keep the folder (and the compiled kernels).
stamp=$(ls -l "$wheel" "${peers[@]}" 2>/dev/null | md5sum)
{
  if [[ -f "$site/.stamp" && "$(cat "$site/.stamp")" == "$stamp" ]]; then
    echo "wheels already installed in $site"
  else
    rm -rf "$site"
    echo "installing $wheel"
    pip_install "$wheel" || { echo "the nvfp4 wheel did not install"; exit 1; }
    # a peer that does not install leaves its columns empty, with the reason in the report
    echo "installing ${peers[*]##*/}"
    pip_install "${peers[@]}" || echo "peer wheels did not install (the bench records Humming as unavailable)"
    echo "$stamp" >"$site/.stamp"
  fi
} 2>&1 | tee "$OUT/env.txt"
((PIPESTATUS[0] == 0)) || exit 1
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"

{
  nvidia-smi -L
  python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__)'
  python3 -c 'import nvfp4; print("nvfp4", nvfp4.__version__, nvfp4.__file__)'
  python3 -c 'import humming.layer, importlib.metadata as m; print("humming-kernels", m.version("humming-kernels"))'
  python3 -c 'import cuda.bindings, importlib.metadata as m; print("cuda-bindings", m.version("cuda-bindings"))'
  command -v nvcc >/dev/null && nvcc --version | tail -n 2
  nproc
} 2>&1 | tee -a "$OUT/env.txt"

cd "$here"
timeout "${PEERS_TIMEOUT:-560}" python3 bench_peers.py --out-dir "$OUT" --max-seconds "${PEERS_BUDGET:-420}" "$@" 2>&1 | tee "$OUT/peers.log"
status=${PIPESTATUS[0]}
ls -la "$OUT"
exit "$status"
