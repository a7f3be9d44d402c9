source .device/setup.sh >/dev/null 2>&1; export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
S=rmsnorm_bwd
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 14 -m gpu tests/test_kernels_gpu.py -k "(sweep_tables and (REFILL or CLUSTER_SEND)) or (float64_reference and norm_bwd and not short_row)" 2>&1 | tail -3 | tee $OUT/refill-tests.log
timeout 100 python -m evals.sweep_knobs layernorm_bwd float32 2048x151936 '{}' "{\"table:$S.CLUSTER_SEND_32BIT\": [[null, \"warps\"]]}" 2>&1 | tee $OUT/ln32-152k.txt | grep -v Warn
for op in layernorm_bwd rmsnorm_bwd; do
timeout 100 python -m evals.sweep_knobs $op bfloat16 8192x32768 '{}' "{\"table:$S.REFILL_PARTS\": [[null, 2]]}" "{\"table:$S.REFILL_PARTS\": [[null, 8]]}" 2>&1 | tee $OUT/$op-16-32k.txt | grep -v Warn
done
G='{"table:reduce.CP_ASYNC_CACHE": "global"}'
timeout 90 python -m evals.sweep_knobs layernorm_bwd float32 1024x262144 '{}' "$G" 2>&1 | tee $OUT/cg-lnbwd.txt | grep -v Warn
timeout 90 python -m evals.sweep_knobs cross_entropy bfloat16 32768x512,32768x1024 '{}' "$G" quack 2>&1 | tee $OUT/cg-ce.txt | grep -v Warn
timeout 90 python -m evals.sweep_knobs softmax bfloat16 32768x512,4096x65536 '{}' "$G" quack 2>&1 | tee $OUT/cg-softmax.txt | grep -v Warn
timeout 150 python -m llmcompile bench rmsnorm_bwd layernorm_bwd --dtype float32 --baselines quack --shapes 262144x1024,65536x4096,16384x16384,8192x32768,4096x65536,2048x131072,1024x262144 --out $OUT --stem bwd-norm-fp32 2>&1 | tail -2
cat $OUT/bwd-norm-fp32.md
