source .device/setup.sh >/dev/null 2>&1; export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
timeout 200 python -m llmcompile bench softmax_bwd log_softmax_bwd cross_entropy_bwd cross_entropy_fused rmsnorm_bwd layernorm_bwd --small --dtype bfloat16 float32 --baselines quack --out $OUT --stem bwd-small 2>&1 | tail -1
cat $OUT/bwd-small.md
timeout 120 python -m llmcompile bench rmsnorm_bwd layernorm_bwd --dtype bfloat16 float32 --baselines quack --shapes 8192x32768 --out $OUT --stem bwd-32k 2>&1 | tail -1
cat $OUT/bwd-32k.md
timeout 150 python -m llmcompile bench cross_entropy cross_entropy_fwd cross_entropy_fused --small --no-graph --rounds 5 --dtype bfloat16 --baselines eager,quack --out $OUT --stem ce-nograph 2>&1 | tail -1
cat $OUT/ce-nograph.md
