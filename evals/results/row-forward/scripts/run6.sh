source .device/setup.sh >/dev/null 2>&1; export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
start=$(date +%s)
GPU_WORKERS=8 timeout 560 bash .ci/gpu tests > /tmp/t.log 2>&1
tail -25 /tmp/t.log | grep -v Warning
echo "wall $(( $(date +%s) - start )) s"
grep -E "^(FAILED|ERROR)" $OUT/gpu-tests.log | head -20
rm -f $OUT/gpu-tests.xml
