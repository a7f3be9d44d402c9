source .device/setup.sh >/dev/null 2>&1; export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv
i=0
for mode in off early wait off early; do
  i=$((i+1))
  python scratch/with_table.py $mode bench cross_entropy cross_entropy_fwd cross_entropy_fused --shapes 32768x256,32768x512,32768x1024 --no-graph --rounds 5 --dtype bfloat16 --baselines quack --out $OUT --stem ng-$i-$mode 2>&1 | grep -v "^\s*$" | tail -14
done
