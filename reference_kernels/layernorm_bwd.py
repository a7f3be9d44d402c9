"""LayerNorm backward over the last dimension, from the forward's saved mean and rstd:
xhat = (x - mean) * rstd, g = dy * w, dx = (g - xhat * mean(g * xhat) - mean(g)) * rstd,
dw = sum over rows of dy * xhat, db = sum over rows of dy.

Kernel contract entry: `launch(mdY, mX, mW, mMean, mRstd, mdX, mdW, mdB, mWork, stream)`; the
RMSNorm backward's kernel (reference_kernels.rmsnorm_bwd.py) with the mean and db.
"""

from __future__ import annotations

import cutlass.cute as cute

from reference_kernels import reduce as R
from reference_kernels.rmsnorm_bwd import WORKSPACE, NormBackward

OP = "layernorm_bwd"
__all__ = ["WORKSPACE", "launch"]

# 16-bit rows staged (1) or held in registers (0), by N: unlike RMSNorm's (rmsnorm_bwd.STAGE_16BIT),
# staged throughout once two tiles are in flight (rmsnorm_bwd.STAGING_DEPTH). H100 bf16, TB/s
# staged / in registers (QuACK), all checked first and timed back to back
# (evals/results/h100-2026-11-24d, sweep-depth.txt): 32768x8192 2.626 / 2.541 (2.642),
# 16384x16384 2.483 / 2.388 (2.484).
STAGE_16BIT: tuple[tuple[int | None, int], ...] = ((None, 1),)


class LayerNormBackward(NormBackward):
    def __init__(self, knobs: R.RowKnobs = R.RowKnobs()) -> None:
        super().__init__(knobs, bias=True)

    @staticmethod
    def stage_16bit() -> tuple[tuple[int | None, int], ...]:
        return STAGE_16BIT

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
