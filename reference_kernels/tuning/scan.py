"""Tuned tables of the scan template (reference_kernels.scan): read at trace time."""

# Elements a thread holds a chunk, by the widest element's bits. A sum at 4 runs at copy speed
# (H200 cumsum fp32 101% of copy, 8: 84%; H100 16: 67-70%).
PER_THREAD: tuple[tuple[int | None, int], ...] = ((None, 4),)
# logcumsumexp's, bound by its combine's exp2 and log2: a longer run spreads the warp's and block's
# combines over more elements, which pays where an element is fewer bytes (H200 16384^2, per_thread
# 4 / 8 / 16: bf16 39.0 / 52.5 / 57.1% of copy; fp32 78.0 / 75.3 / 65.7).
LOG_ADD_EXP_PER_THREAD: tuple[tuple[int | None, int], ...] = ((16, 16), (None, 4))
