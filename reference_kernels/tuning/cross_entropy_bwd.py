"""Tuned tables of the cross-entropy backward: read by reference_kernels.cross_entropy_bwd at trace
time. Each says why; the measurements are in docs/tuning.md."""

from reference_kernels.tuning import rows

# Threads per fp32 row, by N: the template's table (reduce.THREADS_PER_ROW), but a row of up to 2048
# over 256 threads (8 values a thread) rather than 32 (64 values). Measurements: docs/tuning.md,
# cross_entropy_bwd.THREADS_PER_ROW_32BIT.
THREADS_PER_ROW_32BIT: tuple[tuple[int | None, int], ...] = (
    rows.THREADS_PER_ROW[:2] + ((1024, 32), (2048, 256)) + rows.THREADS_PER_ROW[2:]
)
