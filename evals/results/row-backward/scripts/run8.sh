source .device/setup.sh >/dev/null 2>&1; export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
timeout 240 python3 -m pytest -q -p no:cacheprovider -n 14 -m gpu tests/test_kernels_gpu.py tests/test_autograd.py -k "norm_bwd or norm_backward or autograd" 2>&1 | tail -2 | tee $OUT/final2-tests.log
for op in layernorm_bwd rmsnorm_bwd; do
timeout 100 python -m evals.sweep_knobs $op float32 8192x32768,16384x16384 '{}' quack '{}' 2>&1 | tee $OUT/$op-32k-final.txt | grep -v Warn
timeout 100 python -m evals.sweep_knobs $op bfloat16 8192x32768 '{}' quack '{}' 2>&1 | tee -a $OUT/$op-32k-final.txt | grep -v Warn
done
