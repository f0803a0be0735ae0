#!/usr/bin/env bash
# Builds everything the GPU machine needs (it has no Rust toolchain) into gpu-bin/ (git-ignored):
# the release `nvfp4` binary and every integration-test binary, debug info stripped so the
# folder stays well under the device tool's 64 MiB transfer limit. Then, on the GPU machine:
#   scripts/gpu-suite.sh            (with gpu-bin carried)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

cargo build --release
cargo build --release --examples
cargo test --release --no-run

out="$root/gpu-bin"
rm -rf "$out"
mkdir -p "$out"
cp target/release/nvfp4 "$out/nvfp4"
# Dev diagnostics (timing probes for kernel work), e.g. gpu-bin/dev_gemv_diag fixed-cost,
# gpu-bin/dev_gemm_diag timing, gpu-bin/dev_quant_diag timing.
cp target/release/examples/dev_gemv_diag target/release/examples/dev_gemm_diag target/release/examples/dev_quant_diag \
  target/release/examples/dev_launch_cost "$out/"

# Integration-test executables, named test-<target> (e.g. gpu-bin/test-cuda).
cargo test --release --no-run --message-format=json 2>/dev/null | python3 -c '
import json, shutil, sys
out = sys.argv[1]
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    if not m["profile"]["test"] or "test" not in m["target"]["kind"]:
        continue
    name = "test-" + m["target"]["name"]
    shutil.copy2(m["executable"], out + "/" + name)
    print("gpu-bin: " + name)
' "$out"

if command -v strip >/dev/null; then
  for f in "$out"/*; do strip --strip-debug "$f"; done
fi
git rev-parse --short HEAD >"$out/REVISION" 2>/dev/null || true
git status --short >>"$out/REVISION" 2>/dev/null || true
du -sh "$out"
ls -la "$out"
