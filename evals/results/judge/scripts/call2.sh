set -uo pipefail
source .device/setup.sh
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1
timeout 100 python3 .scratch/probe.py "$OUT/probe-vmm.json" vmm 2>&1 | tail -40
timeout 120 python3 .scratch/probe.py "$OUT/probe-clock.json" 2>&1 | tail -40
