source .device/setup.sh >/dev/null 2>&1; export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
start=$(date +%s)
for dt in bfloat16 float32; do
  python3 -m llmcompile bench all --small --dtype $dt --baselines quack --out $OUT --stem small-graph-$dt 2>&1 | grep "^wrote"
  echo "on $dt at $(( $(date +%s) - start )) s"
  CUTE_DSL_CACHE_DIR=/tmp/off-cache python3 scratch/dep_off.py bench all --small --dtype $dt --baselines quack --out $OUT --stem small-graph-off-$dt 2>&1 | grep "^wrote"
  echo "off $dt at $(( $(date +%s) - start )) s"
done
