# issue 49 on the H100 pair: Ray over both GPUs, the 10 level-1 problems with one Ray worker killed mid-run,
# beside the local pool with one GPU of lanes.sh (same machine, /tmp/ray-out); then the smoke suite on the
# local pool and on Ray, both over both GPUs
set -uo pipefail
source .scratch/common.sh
ls /tmp/ray-out
RAY_BACKENDS=ray KB_DIR=.kb10 KILL_AFTER=${KILL_AFTER:-60} RAY_TIME=${KB_S:-300} bash .ci/gpu ray-kb
RAY_TIME=${SMOKE_S:-110} bash .ci/gpu ray-smoke
