"""Tuned tables of the RMSNorm forward: read by reference_kernels.rmsnorm at trace time. Each says
why; the measurements are in docs/tuning.md."""

# How the weight reaches registers (RowKnobs.columns), by N. Measured on H100 (TB/s, early/late/smem):
# fp32 1024x262144 2.65/2.95/2.46 (early's 142 registers leave one CTA per SM); bf16 1024x262144
# 2.82/2.50/2.64, and early is fastest at every bf16 N.
COLUMNS_16BIT: tuple[tuple[int | None, str], ...] = ((None, "early"),)
COLUMNS_32BIT: tuple[tuple[int | None, str], ...] = ((16384, "early"), (None, "late"))
# Staged through shared memory on clustered rows too (H100, fp32, 1024x262144: 2.64 TB/s staged vs
# 2.56 direct; bf16 4096x65536 3.01 vs 2.96 with the row loop below). Measurements: docs/tuning.md,
# rmsnorm.LONG_ROWS_16BIT.
LONG_ROWS_16BIT: tuple[tuple[int | None, dict], ...] = (
    (131072, {"stage_smem": True}),
    (None, {"row_loop": 2, "prefetch_registers": True, "stage_smem": False}),
)
LONG_ROWS_32BIT: tuple[tuple[int | None, dict], ...] = ((None, {"stage_smem": True}),)
