"""Tuned tables of the LayerNorm forward: read by reference_kernels.layernorm at trace time. Each
says why; the measurements are in docs/tuning.md."""

from reference_kernels.tuning import rows

# How weight and bias reach registers (RowKnobs.columns), by N. Measured on H100 (TB/s, early/late/smem):
# bf16 2048x131072 2.29/2.44/2.80, 1024x262144 1.64/2.25/2.42; fp32 4096x65536 2.97/2.89/2.67,
# 1024x262144 2.18/2.27/1.93 (fp32 vectors in shared memory cost the second CTA per SM).
COLUMNS_16BIT: tuple[tuple[int | None, str], ...] = ((16384, "early"), (None, "smem"))
# Short fp32 rows take them through shared memory too, and at 1024 spread over 64 threads
# (THREADS_PER_ROW_32BIT). Measurements: docs/tuning.md, layernorm.COLUMNS_32BIT.
COLUMNS_32BIT: tuple[tuple[int | None, str], ...] = ((512, "smem"), (65536, "early"), (None, "late"))
# Threads per row, by N: the template's table with 64 threads at 1024 (and 16-bit 257-512), and
# 512 for fp32 rows past 64K (half the values a thread). Measurements: docs/tuning.md,
# layernorm.THREADS_PER_ROW_16BIT.
THREADS_PER_ROW_16BIT: tuple[tuple[int | None, int], ...] = (
    rows.THREADS_PER_ROW[:2] + ((256, 32), (512, 64)) + rows.THREADS_PER_ROW[2:]
)
THREADS_PER_ROW_32BIT: tuple[tuple[int | None, int], ...] = (
    rows.THREADS_PER_ROW[:2] + ((512, 32), (1024, 64)) + rows.THREADS_PER_ROW[2:-1] + ((65536, 256), (None, 512))
)
# The longest rows: one CTA loops over row tiles, so weight and bias cross L2 once a CTA rather
# than once a row. Measurements: docs/tuning.md, layernorm.LONG_ROW_16BIT.
LONG_ROW_16BIT = {"row_loop": 2, "threads_per_row": 512, "prefetch_registers": True, "columns": "smem"}
# (cluster_n: N / 32768 rounded up to a power of two: at most 64 values a thread)
LONG_ROWS_16BIT: tuple[tuple[int | None, dict], ...] = (
    (65536, {}),
    (131072, {**LONG_ROW_16BIT, "cluster_n": 4}),
    (262144, {**LONG_ROW_16BIT, "cluster_n": 8}),
    (None, {**LONG_ROW_16BIT, "cluster_n": 16}),
)
LONG_ROWS_32BIT: tuple[tuple[int | None, dict], ...] = (
    (131072, {}),
    (None, {"row_loop": 8, "columns": "early", "stage_smem": True}),
)
