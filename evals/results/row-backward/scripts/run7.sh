source .device/setup.sh >/dev/null 2>&1; export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
S=rmsnorm_bwd
D="\"table:$S.STAGING_DEPTH_32BIT\": [[null, 2]]"; C="\"table:$S.CTAS_PER_SM_32BIT\": [[null, 2]]"
for op in layernorm_bwd rmsnorm_bwd; do
timeout 200 python -m evals.sweep_knobs $op float32 8192x32768 '{}' "{$D}" "{\"cluster_n\": 8}" "{\"cluster_n\": 8, $D}" "{$C}" "{$C, $D}" "{\"cluster_n\": 8, $C}" quack 2>&1 | tee $OUT/$op-32-32k.txt | grep -v Warn
done
