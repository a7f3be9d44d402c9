source .device/setup.sh >/dev/null 2>&1; export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
S=rmsnorm_bwd
P="\"table:$S.REFILL_PARTS\""; C="\"table:$S.CLUSTER_SEND\": [[null, \"cta\"]]"
timeout 200 python -m evals.sweep_knobs layernorm_bwd float32 1024x262144 '{}' "{$C}" \
  "{$P: [[null, 2]], $C}" "{$P: [[null, 4]], $C}" "{$P: [[null, 8]], $C}" "{$P: [[null, 2]], $C, \"table:$S.SUMS_PASS\": [[null, \"second\"]]}" \
  '{}' "{$P: [[null, 2]], $C}" "{$P: [[null, 8]], $C}" 2>&1 | tee $OUT/ln32-256k-cta.txt | grep -v Warn
timeout 120 python -m evals.sweep_knobs rmsnorm_bwd float32 1024x262144 '{}' "{$C}" "{$P: [[null, 2]], $C}" "{$P: [[null, 8]], $C}" 2>&1 | tee $OUT/rms32-256k-cta.txt | grep -v Warn
for op in layernorm_bwd rmsnorm_bwd; do
timeout 150 python -m evals.sweep_knobs $op float32 8192x32768,32768x8192 '{}' "{$P: [[null, 2]]}" "{$P: [[null, 8]]}" "{$C}" "{$P: [[null, 2]], $C}" 2>&1 | tee $OUT/$op-32-mid.txt | grep -v Warn
done
