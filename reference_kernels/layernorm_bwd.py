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
from reference_kernels.tuning import layernorm_bwd as T
from reference_kernels.tuning import rmsnorm_bwd as rmsnorm_tables

OP = "layernorm_bwd"
__all__ = ["WORKSPACE", "launch"]


class LayerNormBackward(NormBackward):
    def __init__(self, knobs: R.RowKnobs = R.RowKnobs()) -> None:
        super().__init__(knobs, bias=True)

    @staticmethod
    def stage_16bit() -> tuple[tuple[int | None, int], ...]:
        return T.STAGE_16BIT

    @staticmethod
    def knobs_16bit() -> tuple[tuple[int | None, dict], ...]:
        return ((None, {}),)  # (QuACK's shape at 4096 lost to 256 threads a row: see THREADS_PER_ROW)

    @staticmethod
    def knobs_32bit() -> tuple[tuple[int | None, dict], ...]:
        return T.KNOBS_32BIT

    @staticmethod
    def arithmetic_table(bits: int) -> tuple[tuple[int | None, tuple[str, ...]], ...]:
        return T.ARITHMETIC_16BIT if bits <= 16 else T.ARITHMETIC_32BIT

    @staticmethod
    def ctas_per_sm_table(bits: int) -> tuple[tuple[int | None, int], ...]:
        return T.CTAS_PER_SM if bits <= 16 else rmsnorm_tables.CTAS_PER_SM_32BIT

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


class LayerNormBackwardScalar(LayerNormBackward):
    """LayerNorm's backward for an upstream gradient that is one value everywhere, read as that
    value (rmsnorm_bwd.NormBackwardScalar's). Contract entry:
    `launch(mX, mdY, mW, mMean, mRstd, mdX, mdW, mdB, mWork, stream)`, mdY (1,) in x's dtype."""

    one_dy = True

    @cute.jit
    def __call__(
        self,
        mX: cute.Tensor,
        mdY: cute.Tensor,
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
