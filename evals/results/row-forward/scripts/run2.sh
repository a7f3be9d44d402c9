source .device/setup.sh >/dev/null 2>&1; export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -c "import xdist" || echo "no xdist"
start=$(date +%s)
timeout 420 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 -k "not attention and not row_loop" \
  tests/test_kernels_gpu.py tests/test_autograd.py tests/test_callpath.py tests/test_export.py tests/test_artifact.py tests/test_norm.py \
  2>&1 | tee $OUT/pdl-tests.log | tail -12
echo "tests wall $(( $(date +%s) - start )) s"
CUTE_DSL_CACHE_DIR=/tmp/nowait-cache timeout 90 python3 scratch/nowait.py 2>&1 | tail -4 | tee $OUT/nowait.log
