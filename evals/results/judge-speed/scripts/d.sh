# the two reference kernels that failed before the fix, the honest reductions again, the main command
# cold and warm and one check (after), then the level-1 eval with the code before this session (partial)
set -uo pipefail
source .scratch/common.sh
t=tests/test_harness_gpu.py::test_reference_kernel_accepted
timeout 90 python3 -m pytest -q -p no:cacheprovider "$t[rmsnorm_bwd-bfloat16]" "$t[layernorm_bwd-bfloat16]" 2>&1 | tee $OUT/judge-reference-2.log | tail -4
timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_honest_reductions.py 2>&1 | tee $OUT/honest-reductions.log | tail -4
KB_DIR=.kb10 timeout 200 bash .ci/gpu speed
start=$(date +%s)
(cd .before && PYTHONPATH="$PWD:$PYTHONPATH" timeout -s INT 200 python3 -m llmcompile eval evals/kernelbench-l1.toml --problems ../.kb10 --out /tmp/kb10-before 2>&1 | tail -25)
echo "kb10 before: wall $(( $(date +%s) - start )) s" | tee -a $OUT/speed.txt
tar czf $OUT/kb10-before.tgz -C /tmp kb10-before
cd $OUT && tar czf all.tgz --remove-files $(ls | grep -v all.tgz)
