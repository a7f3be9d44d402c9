# the reference kernels not run through the judge before, one judge process a GPU (the machine of
# ../../judge-speed/scripts/b2.sh, warm; .device unpacked in /tmp/site)
source .scratch/common.sh; export GPU_SPREAD=2 LLMCOMPILE_CPUS=16
timeout -s INT 200 python3 -m pytest -q -p no:cacheprovider -n 2 -rfE tests/test_harness_gpu.py \
  -k 'reference_kernel_accepted and (log_softmax or _fwd or softmax_bwd or cross_entropy_)' --junitxml=$OUT/harness2.xml
