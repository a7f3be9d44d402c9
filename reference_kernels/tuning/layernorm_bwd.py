"""Tuned tables of the LayerNorm backward (the rest is RMSNorm's, tuning.rmsnorm_bwd): read by
reference_kernels.layernorm_bwd at trace time. Each says why; the measurements are in
docs/tuning.md."""

# 16-bit rows staged (1) or held in registers (0), by N: unlike RMSNorm's (rmsnorm_bwd.STAGE_16BIT),
# staged throughout once two tiles are in flight (rmsnorm_bwd.STAGING_DEPTH). Measurements:
# docs/tuning.md, layernorm_bwd.STAGE_16BIT.
STAGE_16BIT: tuple[tuple[int | None, int], ...] = ((None, 1),)
# The arithmetic forms a row takes (rmsnorm_bwd.ARITHMETIC_16BIT says what each is). Measurements:
# docs/tuning.md, layernorm_bwd.ARITHMETIC_16BIT.
ARITHMETIC_16BIT: tuple[tuple[int | None, tuple[str, ...]], ...] = (
    (2048, ("dx", "xhat", "sums")), (4096, ()), (16384, ("xhat", "sums")), (None, ("dx", "xhat", "sums"))
)  # fmt: skip
ARITHMETIC_32BIT: tuple[tuple[int | None, tuple[str, ...]], ...] = ((None, ("dx", "xhat", "sums")),)
# Row-tile CTAs a SM for 16-bit rows, by N: RMSNorm's table (rmsnorm_bwd.CTAS_PER_SM says why)
# but 8 at 1024, where 4 lost 10% (H100 bf16 32768x1024, TB/s at 8 / 4, 2.217 / 1.991, QuACK
# 1.763: evals/results/h100-2026-11-24e, ctas2.txt). 32-bit rows as RMSNorm's.
CTAS_PER_SM: tuple[tuple[int | None, int], ...] = ((1024, 8), (2048, 4), (16384, 2), (None, 4))
# Knob sets for 32-bit rows, by N (RMSNorm's are empty): cluster 8 at 16385-32768, two tiles staged
# (rmsnorm_bwd.STAGING_DEPTH_32BIT). Measurements: docs/tuning.md, layernorm_bwd.KNOBS_32BIT.
KNOBS_32BIT: tuple[tuple[int | None, dict], ...] = ((16384, {}), (32768, {"cluster_n": 8}), (None, {}))
