"""Tuned tables of the scan template (reference_kernels.scan): read at trace time."""

# Elements a thread holds a chunk, by the widest element's bits. A sum at 4 runs at copy speed
# (H200 cumsum fp32 101% of copy, 8: 84%; H100 16: 67-70%).
PER_THREAD: tuple[tuple[int | None, int], ...] = ((None, 4),)
# logcumsumexp's, bound by its combine's exp2 and log2: a longer run spreads the warp's and block's
# combines over more elements, which pays where an element is fewer bytes (H200 16384^2, per_thread
# 4 / 8 / 16: bf16 39.0 / 52.5 / 57.1% of copy; fp32 78.0 / 75.3 / 65.7).
LOG_ADD_EXP_PER_THREAD: tuple[tuple[int | None, int], ...] = ((16, 16), (None, 4))

# The column scan (reference_kernels.scan_columns: a scan along a dim other than the last).
# Threads a CTA, by the widest element's bits: a bf16 CTA of 128 fits three an SM at its ~160
# registers a thread, where 256 fit one
COLUMN_NUM_THREADS: tuple[tuple[int | None, int], ...] = ((16, 128), (None, 256))
# Rows a thread holds a chunk, by the widest element's bits: its loads in flight (8 x 8 bf16 in
# two buffers took 255 registers)
COLUMN_PER_THREAD: tuple[tuple[int | None, int], ...] = ((16, 4), (None, 8))
# logcumsumexp's, whose combine is an exp2 and a log2: 8 spent more on them than it hid
COLUMN_LOG_ADD_EXP_PER_THREAD: tuple[tuple[int | None, int], ...] = ((None, 4),)
# Threads along L at most: each step of their scan is a barrier and a combine (32 lost 7-10 points)
COLUMN_MAX_THREADS_R = 8
COLUMN_LOG_ADD_EXP_MAX_THREADS_R = 4
# A middle dim's CTAs are as many again for every batch item: threads along it only where each
# still walks this many chunks (a short one's threads along it idled)
COLUMN_MIN_CHUNKS = 8
COLUMN_TARGET_CTAS = 264  # threads along L added until the columns make this many CTAs: two a SM of the H100
# The batch dim split into segments (x read twice: totals, then the scan) only where the columns
# make fewer CTAs than this (unsplit they starve: 256 columns ran at 3.8% of copy, 4096 at 52)
COLUMN_SPLIT_BELOW_CTAS = 33
# CTAs the segments make (4096 columns in 32 CTAs, 4 / 9 / 16 segments: 60.7 / 60.6 / 65.0%)
COLUMN_SPLIT_TARGET_CTAS = 512
COLUMN_MAX_SPLITS = 64  # segments' totals each column's fold reads
COLUMN_MAX_WORKSPACE = 1 << 23  # fp32 elements: the kernel contract's limit (llmcompile.specs.contract)
