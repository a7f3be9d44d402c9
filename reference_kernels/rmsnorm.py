"""RMSNorm over the last dimension: out[m, :] = x[m, :] * rsqrt(mean(x[m, :]^2) + eps) * w.

Kernel contract entry: `launch(mX, mW, mO, eps, stream)`; mX, mO (M, N), mW (N,), eps fp32.
"""

from __future__ import annotations

import functools

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from reference_kernels import reduce as R
from reference_kernels.tuning import rmsnorm as T

OP = "rmsnorm"


class RMSNorm:
    save_rstd = False  # also write each row's rstd (what the backward needs): rmsnorm_fwd

    def __init__(self, knobs: R.RowKnobs = R.RowKnobs()) -> None:
        self.knobs = knobs

    @cute.jit
    def __call__(self, mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor, eps: Float32, stream):
        self._launch(mX, mW, mO, mO, eps, stream)  # (no rstd: mRstd is never written)

    def _launch(self, mX, mW, mO, mRstd, eps, stream) -> None:
        widest = max(mO.element_type.width, mW.element_type.width)
        n = mX.shape[1]
        narrow = mX.element_type.width <= 16
        knobs = R.fill_knobs(self.knobs, T.LONG_ROWS_16BIT if narrow else T.LONG_ROWS_32BIT, n)
        table = T.COLUMNS_16BIT if narrow else T.COLUMNS_32BIT
        self.tiling, self.columns = R.resolve_with_columns(knobs, mX.element_type.width, n, widest, 1, table)
        copy = R.row_tiled_copy(mX.element_type, self.tiling)
        R.launch_rows(self.kernel(mX, mW, mO, mRstd, eps, copy), self.tiling, mX.shape[0], stream, waits=True)

    @cute.kernel
    def kernel(
        self, mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor, mRstd: cute.Tensor, eps: Float32, copy: cute.TiledCopy
    ):
        t = self.tiling
        tidx, smem, sX, (scratch,) = R.begin_rows(t, mX.element_type, 1)
        begun = R.columns_begin(R.RowContext.make(t, copy, mX, tidx), smem, self.columns, (mW,))
        R.for_each_row(t, copy, mX, sX, tidx, 0.0, functools.partial(self.row, mW, mO, mRstd, eps, scratch, begun))

    @cute.jit
    def row(self, mW, mO, mRstd, eps: Float32, scratch: R.ReductionScratch, begun: tuple, ctx: R.RowContext, tXrX):
        t = self.tiling
        x = tXrX.load().to(Float32)
        sq = (x * x).reduce(cute.ReductionOp.ADD, init_val=0.0, reduction_profile=0)
        (ss,) = R.row_reduce((sq,), R.add, t, scratch.at(ctx))
        rstd = cute.math.rsqrt(ss / t.n + eps, fastmath=True)
        if cutlass.const_expr(self.save_rstd):
            if ctx.row_ok & ctx.row_leader:
                mRstd[ctx.row] = rstd
        (rW,) = R.columns_end(ctx, self.columns, (mW,), begun)
        R.store_row(ctx, x * rstd * rW.load().to(Float32), mO)


launch = RMSNorm(R.RowKnobs())
