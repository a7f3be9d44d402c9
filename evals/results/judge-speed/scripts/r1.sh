set -uo pipefail
# the machine of r0, warm: /tmp/site (the device pack, unpacked there) and /tmp/ray-out stay
export PYTHONPATH="$PWD:/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages" PYTHONUNBUFFERED=1 LLMCOMPILE_RESULTS_DIR=$OUT
ls /tmp/site/.ready /tmp/ray-out
RAY_BACKENDS=ray KB_DIR=.kb10 KILL_AFTER=40 timeout 560 bash .ci/gpu ray-smoke ray-kb
