source .device/setup.sh >/dev/null 2>&1; export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
start=$(date +%s)
ops="softmax cross_entropy rmsnorm layernorm softmax_bwd rmsnorm_bwd layernorm_bwd cross_entropy_fused"
mkdir -p /tmp/r5
python3 -m llmcompile bench $ops --dtype bfloat16 --baselines none --out /tmp/r5 --stem big-on 2>&1 | grep "^wrote"
echo "on at $(( $(date +%s) - start )) s"
CUTE_DSL_CACHE_DIR=/tmp/off-cache python3 scratch/dep_off.py bench $ops --dtype bfloat16 --baselines none --out /tmp/r5 --stem big-off 2>&1 | grep "^wrote"
echo "off at $(( $(date +%s) - start )) s"
cp /tmp/r5/*.md $OUT/; tar -C /tmp/r5 -cf $OUT/r5.tar .
