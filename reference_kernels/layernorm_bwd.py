"""LayerNorm backward over the last dimension, from the forward's saved mean and rstd:
xhat = (x - mean) * rstd, g = dy * w, dx = (g - xhat * mean(g * xhat) - mean(g)) * rstd,
dw = sum over rows of dy * xhat, db = sum over rows of dy.

Kernel contract entry: `launch(mdY, mX, mW, mMean, mRstd, mdX, mdW, mdB, mWork, stream)`; the
RMSNorm backward's kernel (reference_kernels.rmsnorm_bwd.py) with the mean and db.
"""

from __future__ import annotations

import cutlass.cute as cute

from reference_kernels import reduce as R
from reference_kernels.rmsnorm_bwd import CTAS_PER_SM_32BIT, WORKSPACE, NormBackward

OP = "layernorm_bwd"
__all__ = ["WORKSPACE", "launch"]

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


class LayerNormBackward(NormBackward):
    def __init__(self, knobs: R.RowKnobs = R.RowKnobs()) -> None:
        super().__init__(knobs, bias=True)

    @staticmethod
    def stage_16bit() -> tuple[tuple[int | None, int], ...]:
        return STAGE_16BIT

    @staticmethod
    def knobs_16bit() -> tuple[tuple[int | None, dict], ...]:
        return ((None, {}),)  # (QuACK's shape at 4096 lost to 256 threads a row: see THREADS_PER_ROW)

    @staticmethod
    def knobs_32bit() -> tuple[tuple[int | None, dict], ...]:
        return KNOBS_32BIT

    @staticmethod
    def arithmetic_table(bits: int) -> tuple[tuple[int | None, tuple[str, ...]], ...]:
        return ARITHMETIC_16BIT if bits <= 16 else ARITHMETIC_32BIT

    @staticmethod
    def ctas_per_sm_table(bits: int) -> tuple[tuple[int | None, int], ...]:
        return CTAS_PER_SM if bits <= 16 else CTAS_PER_SM_32BIT

    @cute.jit
    def __call__(
        self,
        mdY: cute.Tensor,
        mX: cute.Tensor,
        mW: cute.Tensor,
        mMean: cute.Tensor,
        mRstd: cute.Tensor,
        mdX: cute.Tensor,
        mdW: cute.Tensor,
        mdB: cute.Tensor,
        mWork: cute.Tensor,
        stream,
    ):
        self._launch(mdY, mX, mW, mMean, mRstd, mdX, mdW, mdB, mWork, stream)


launch = LayerNormBackward(R.RowKnobs())
