# issue 46 (and 49's one-GPU baseline): the code before (.before, e3a934e) and after, side by side on
# one H100 pair: each its own GPU and 16 of the 32 cores (taskset), its own torch.compile/triton caches,
# every cache empty. Each lane: the smoke suite, then the 10 level-1 problems of .kb10, within LANE_S.
set -uo pipefail
source .scratch/common.sh
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader; nproc
python3 -c "import torch, cutlass; print(torch.__version__, cutlass.__version__)"
rm -rf ~/.cache/llmcompile /tmp/torchinductor_* ~/.triton
LANE_S=${LANE_S:-500}
nvidia-smi --query-gpu=index,utilization.gpu --format=csv,noheader,nounits -lms 1000 > $OUT/util.csv &
smi=$!
lane() {  # name cores gpu dir smoke-suite kb-suite kb-dir
  local name=$1 cores=$2 gpu=$3 dir=$4 smoke=$5 kb=$6 kbdir=$7 t0 t1 left
  export CUDA_VISIBLE_DEVICES=$gpu TORCHINDUCTOR_CACHE_DIR=/tmp/ind-$name TRITON_CACHE_DIR=/tmp/tri-$name
  cd "$dir" && export PYTHONPATH="$PWD:$PYTHONPATH"
  t0=$(date +%s)
  timeout -s INT 230 taskset -c "$cores" python3 -m llmcompile eval "$smoke" --out /tmp/smoke-$name > /tmp/smoke-$name.log 2>&1
  t1=$(date +%s); echo "$name smoke: wall $((t1 - t0)) s" >> /tmp/lanes.txt
  left=$(( LANE_S - (t1 - t0) ))
  timeout -s INT $left taskset -c "$cores" python3 -m llmcompile eval "$kb" --problems "$kbdir" --out /tmp/kb10-$name > /tmp/kb10-$name.log 2>&1
  echo "$name kb10: wall $(( $(date +%s) - t1 )) s" >> /tmp/lanes.txt
}
( lane before 16-31 0 .before evals/smoke.toml evals/kernelbench-l1.toml ../.kb10 ) &
b=$!
( lane after 0-15 1 . evals/suites/smoke.toml evals/suites/kernelbench-l1.toml .kb10 ) &
a=$!
wait $b $a
kill $smi
cat /tmp/lanes.txt | tee $OUT/lanes.txt
w() { grep "^$1 $2:" /tmp/lanes.txt | sed 's/.*wall \([0-9]*\) s/\1/'; }
python3 -m evals.scripts.eval_speed /tmp/smoke-before:$(w before smoke):1 /tmp/smoke-after:$(w after smoke):1 \
  /tmp/kb10-before:$(w before kb10):1 /tmp/kb10-after:$(w after kb10):1 2>&1 | tee $OUT/speed.md | head -8
tail -5 /tmp/smoke-*.log /tmp/kb10-*.log
mkdir -p /tmp/ray-out && cp /tmp/kb10-after/results.json /tmp/ray-out/kb-local-1.json 2>/dev/null
echo "kb-local-1: wall $(w after kb10) s" >> /tmp/ray-out/ray.txt
cd /tmp && tar czf $OUT/lanes.tgz --exclude='*.so' --exclude='*.cubin' smoke-before smoke-after kb10-before kb10-after smoke-*.log kb10-*.log
