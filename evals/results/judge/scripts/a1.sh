set -uo pipefail
source .scratch/common.sh
nproc; free -g | head -2
JUDGE_K="bad or twin or read_only or custom or never_imports" JUDGE_HONEST=0 timeout 560 bash .ci/gpu judge
