source .device/setup.sh >/dev/null 2>&1; export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
git log --oneline -1 2>/dev/null; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 220 python3 -m pytest -q -p no:cacheprovider -n 14 -m gpu tests/test_kernels_gpu.py tests/test_autograd.py -k "norm_bwd or norm_backward or autograd" 2>&1 | tail -3 | tee $OUT/final-tests.log
timeout 360 python -m llmcompile bench softmax_bwd log_softmax_bwd cross_entropy_bwd cross_entropy_fused rmsnorm_bwd layernorm_bwd --dtype bfloat16 float32 --baselines quack --out $OUT --stem bwd 2>&1 | tail -1
cat $OUT/bwd.md
