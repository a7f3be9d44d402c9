set -uo pipefail
source .scratch/common.sh
nvidia-smi --query-gpu=index,name --format=csv,noheader; nproc
RAY_BACKENDS=local KB_DIR=.kb10 timeout 560 bash .ci/gpu ray-smoke ray-kb
