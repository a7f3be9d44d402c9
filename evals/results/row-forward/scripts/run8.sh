source .device/setup.sh >/dev/null 2>&1; export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
start=$(date +%s)
timeout 400 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 \
  -k "back_to_back or public_function or sweep_tables or second_call or (test_matches_float64_reference and (1024 or 65536 or 262144) and bfloat16)" \
  tests/test_kernels_gpu.py tests/test_autograd.py tests/test_callpath.py tests/test_export.py tests/test_artifact.py tests/test_norm.py \
  2>&1 | tee $OUT/final-tests.log | tail -4
echo "tests wall $(( $(date +%s) - start )) s"
timeout 150 python3 -m llmcompile bench cross_entropy softmax rmsnorm layernorm --small --no-graph --rounds 3 --dtype bfloat16 --baselines quack --out /tmp/b8 --stem final-nograph 2>&1 | grep "^|" | tee $OUT/final-nograph.md
