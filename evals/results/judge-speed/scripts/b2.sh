# issue 46 after the start-up and input fixes ("after2": the judge starts first, KernelBench inputs made
# on the GPU), on GPU 1 and cores 0-15 with every cache of its own empty, as lanes.sh's lanes; beside it on
# GPU 0 and cores 16-31 (issues 45, 50): the judge's tests of the reference kernels not run on the H100
# before, then the kernels' GPU tests, until the call's time is up
set -uo pipefail
source .scratch/common.sh
LANE_S=${LANE_S:-470}
(
  export CUDA_VISIBLE_DEVICES=1 LLMCOMPILE_CACHE=/tmp/cache-after2 TORCHINDUCTOR_CACHE_DIR=/tmp/ind-after2 TRITON_CACHE_DIR=/tmp/tri-after2
  t0=$(date +%s)
  timeout -s INT 230 taskset -c 0-15 python3 -m llmcompile eval evals/suites/smoke.toml --out /tmp/smoke-after2 > /tmp/smoke-after2.log 2>&1
  t1=$(date +%s); echo "after2 smoke: wall $((t1 - t0)) s" >> /tmp/lanes.txt
  timeout -s INT $(( LANE_S - (t1 - t0) )) taskset -c 0-15 python3 -m llmcompile eval evals/suites/kernelbench-l1.toml --problems .kb10 \
    --out /tmp/kb10-after2 > /tmp/kb10-after2.log 2>&1
  echo "after2 kb10: wall $(( $(date +%s) - t1 )) s" >> /tmp/lanes.txt
) &
lane=$!
(
  export CUDA_VISIBLE_DEVICES=0 LLMCOMPILE_CPUS=16
  t0=$(date +%s)
  k='reference_kernel_accepted and (log_softmax or _fwd or softmax_bwd or cross_entropy_ or attention)'
  timeout -s INT 300 taskset -c 16-31 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_harness_gpu.py -k "$k" \
    --junitxml=$OUT/harness.xml > $OUT/harness.log 2>&1
  left=$(( LANE_S - ($(date +%s) - t0) ))
  timeout -s INT $left taskset -c 16-31 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 -rfE --ignore=tests/test_harness_gpu.py \
    --junitxml=$OUT/gpu-tests.xml > $OUT/gpu-tests.log 2>&1
) &
suite=$!
wait $lane $suite
cat /tmp/lanes.txt
w() { grep "^$1 $2:" /tmp/lanes.txt | sed 's/.*wall \([0-9]*\) s/\1/'; }
python3 -m evals.scripts.eval_speed /tmp/smoke-before:$(w before smoke):1 /tmp/smoke-after:$(w after smoke):1 \
  /tmp/smoke-after2:$(w after2 smoke):1 /tmp/kb10-before:$(w before kb10):1 /tmp/kb10-after:$(w after kb10):1 \
  /tmp/kb10-after2:$(w after2 kb10):1 2>&1 | tee $OUT/speed.md | head -9
tail -4 $OUT/harness.log $OUT/gpu-tests.log
cp /tmp/lanes.txt $OUT/
cd /tmp && tar czf $OUT/after2.tgz --exclude='*.so' --exclude='*.cubin' smoke-after2 kb10-after2 smoke-after2.log kb10-after2.log
mkdir -p /tmp/ray-out && cp /tmp/kb10-after2/results.json /tmp/ray-out/kb-local-1.json 2>/dev/null
echo "kb-local-1: wall $(w after2 kb10) s" >> /tmp/ray-out/ray.txt
