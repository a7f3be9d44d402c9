set -uo pipefail
source .scratch/common.sh
t=tests/test_harness_gpu.py::test_reference_kernel_accepted
ids=""
for op in softmax rmsnorm layernorm cross_entropy rmsnorm_bwd layernorm_bwd cross_entropy_fused; do
  for dt in bfloat16 float32; do ids="$ids $t[$op-$dt]"; done
done
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_harness_gpu.py -k "weight_as_scratch or custom" 2>&1 | tee $OUT/judge-extra.log | tail -4
cp $OUT/harness-verdicts.md $OUT/harness-verdicts-extra.md 2>/dev/null
timeout 300 python3 -m pytest -q -p no:cacheprovider --durations=20 $ids 2>&1 | tee $OUT/judge-reference.log | tail -30
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_honest_reductions.py 2>&1 | tee $OUT/honest-reductions.log | tail -8
