"""Limit tables of the row template (reference_kernels.row_plan): the first row whose limit is >= N
wins, None meaning "and above". Each says why beside it; the measurements behind them are in
docs/tuning.md."""

# Threads cooperating on one row: enough that each holds at most ~64 values of the row.
THREADS_PER_ROW: tuple[tuple[int | None, int], ...] = (
    (64, 8),
    (128, 16),
    (3072, 32),
    (6144, 64),
    (16384, 128),
    (None, 256),
)
# Threads per CTA: 128 keeps more CTAs resident for short rows; 256 for long ones.
NUM_THREADS: tuple[tuple[int | None, int], ...] = ((16384, 128), (None, 256))
# CTAs per row (cluster size), by N for 16-bit and for 32-bit elements: the row slice a CTA
# holds stays <= 16K elements (<= 64 fp32 registers a thread at 256 threads).
CLUSTER_N_16BIT: tuple[tuple[int | None, int], ...] = (
    (16384, 1),
    (32768, 2),
    (65536, 4),
    (131072, 8),
    (None, 16),
)
CLUSTER_N_32BIT: tuple[tuple[int | None, int], ...] = (
    (16384, 1),
    (32768, 2),
    (65536, 4),
    (131072, 8),
    (None, 16),
)
# Launch as a programmatic dependent (RowKnobs.dependent_launch): without CUDA graphs the next
# kernel's launch is processed while this one ends, not after. Measurements: docs/tuning.md,
# reduce.DEPENDENT_LAUNCH.
DEPENDENT_LAUNCH: tuple[tuple[int | None, bool], ...] = ((None, True),)
