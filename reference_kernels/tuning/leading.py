"""Tuned tables of the leading-dim template (a reduction over the batch dim): read by
reference_kernels.leading at trace time. Each says why."""

# 132 SMs x 8 CTAs of 256 threads: the H100 full at once, as the whole-tensor template fills it
TARGET_CTAS = 1056
NUM_THREADS = 256
# An odd column count (scalar loads): wide CTAs, as the strided template's SCALAR_THREADS
SCALAR_THREADS = 1024
# Up to 32 threads along R before R is split over CTAs: a warp then still loads 8 columns of
# 16 bytes, whole 128-byte lines of four rows
MAX_THREADS_R = 32
# CTAs along R at most: each adds a partial a column to the workspace and to the final fold
MAX_SPLITS = 64
FINAL_THREADS = 256
MAX_WORKSPACE = 1 << 23  # fp32 elements: the kernel contract's limit (llmcompile.specs.contract)
