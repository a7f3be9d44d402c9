source .device/setup.sh >/dev/null 2>&1; export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
S=rmsnorm_bwd
timeout 330 python -m evals.sweep_knobs layernorm_bwd float32 1024x262144 '{}' \
  "{\"table:$S.REFILL_PARTS\": [[null, 1]]}" "{\"table:$S.REFILL_PARTS\": [[null, 2]]}" "{\"table:$S.REFILL_PARTS\": [[null, 4]]}" \
  "{\"table:$S.SUMS_PASS\": [[null, \"second\"]]}" \
  "{\"table:$S.SUMS_PASS\": [[null, \"second\"]], \"table:$S.REFILL_PARTS\": [[null, 2]]}" \
  "{\"table:$S.SUMS_PASS\": [[null, \"second\"]], \"table:$S.REFILL_PARTS\": [[null, 4]]}" \
  '{}' 2>&1 | tee $OUT/ln32-256k.txt | grep -v Warn
timeout 120 python -m evals.sweep_knobs rmsnorm_bwd float32 1024x262144 '{}' \
  "{\"table:$S.REFILL_PARTS\": [[null, 2]]}" "{\"table:$S.REFILL_PARTS\": [[null, 4]]}" \
  "{\"table:$S.SUMS_PASS\": [[null, \"second\"]]}" 2>&1 | tee $OUT/rms32-256k.txt | grep -v Warn
timeout 150 python -m evals.sweep_knobs cross_entropy bfloat16 32768x512,32768x256,32768x1024 '{}' \
  '{"table:cross_entropy.EXP_SUM": [[null, "tree"]]}' quack '{}' '{"table:cross_entropy.EXP_SUM": [[null, "tree"]]}' 2>&1 | tee $OUT/ce-tree.txt | grep -v Warn
