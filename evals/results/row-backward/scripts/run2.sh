source .device/setup.sh >/dev/null 2>&1; export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
S=rmsnorm_bwd
P="\"table:$S.REFILL_PARTS\""; H="\"table:$S.REFILL_HELD\""
timeout 400 python -m evals.sweep_knobs layernorm_bwd float32 1024x262144 '{}' \
  "{$P: [[null, 2]]}" "{$P: [[null, 8]]}" \
  "{$P: [[null, 2]], $H: [[null, 1]]}" "{$P: [[null, 4]], $H: [[null, 1]]}" "{$P: [[null, 8]], $H: [[null, 1]]}" "{$P: [[null, 8]], $H: [[null, 2]]}" \
  "{$P: [[null, 2]], \"columns\": \"early\"}" "{$P: [[null, 2]], \"table:$S.CLUSTER_SEND\": [[null, \"cta\"]]}" \
  '{}' "{$P: [[null, 2]]}" 2>&1 | tee $OUT/ln32-256k-held.txt | grep -v Warn
