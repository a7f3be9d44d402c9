"""LayerNorm over the last dimension: out = (x - mean) * rsqrt(var + eps) * w + b (biased var).

Kernel contract entry: `launch(mX, mW, mB, mO, eps, stream)`; mX, mO (M, N), mW, mB (N,).
Mean and variance come from one reduction of (count, mean, M2) triples (Chan's merge): one
trip through the reduction levels, and no cancellation as in E[x^2] - E[x]^2.
"""

from __future__ import annotations

import functools

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from reference_kernels import reduce as R
from reference_kernels.tuning import layernorm as T

OP = "layernorm"


class LayerNorm:
    save_stats = False  # also write each row's mean and rstd (what the backward needs): layernorm_fwd

    def __init__(self, knobs: R.RowKnobs = R.RowKnobs()) -> None:
        self.knobs = knobs

    @cute.jit
    def __call__(self, mX: cute.Tensor, mW: cute.Tensor, mB: cute.Tensor, mO: cute.Tensor, eps: Float32, stream):
        self._launch(mX, mW, mB, mO, mO, mO, eps, stream)  # (no stats: mMean, mRstd never written)

    def _launch(self, mX, mW, mB, mO, mMean, mRstd, eps, stream) -> None:
        widest = max(mO.element_type.width, mW.element_type.width, mB.element_type.width)
        n = mX.shape[1]
        narrow = mX.element_type.width <= 16
        knobs = R.fill_knobs(self.knobs, T.LONG_ROWS_16BIT if narrow else T.LONG_ROWS_32BIT, n)
        self.tiling, self.columns = R.resolve_with_columns(
            knobs,
            mX.element_type.width,
            n,
            widest,
            2,
            T.COLUMNS_16BIT if narrow else T.COLUMNS_32BIT,
            T.THREADS_PER_ROW_16BIT if narrow else T.THREADS_PER_ROW_32BIT,
        )
        copy = R.row_tiled_copy(mX.element_type, self.tiling)
        R.launch_rows(
            self.kernel(mX, mW, mB, mO, mMean, mRstd, eps, copy), self.tiling, mX.shape[0], stream, waits=True
        )

    @cute.kernel
    def kernel(
        self,
        mX: cute.Tensor,
        mW: cute.Tensor,
        mB: cute.Tensor,
        mO: cute.Tensor,
        mMean: cute.Tensor,
        mRstd: cute.Tensor,
        eps: Float32,
        copy: cute.TiledCopy,
    ):
        t = self.tiling
        tidx, smem, sX, (scratch,) = R.begin_rows(t, mX.element_type, 3)
        # weight and bias: once per CTA, whichever row tiles it goes on to
        begun = R.columns_begin(R.RowContext.make(t, copy, mX, tidx), smem, self.columns, (mW, mB))
        row = functools.partial(self.row, mW, mB, mO, mMean, mRstd, eps, scratch, begun)
        R.for_each_row(t, copy, mX, sX, tidx, 0.0, row)

    @cute.jit
    def row(
        self, mW, mB, mO, mMean, mRstd, eps: Float32, scratch: R.ReductionScratch, begun: tuple, ctx: R.RowContext, tXrX
    ):
        t = self.tiling
        x = tXrX.load().to(Float32)
        # Exact two-pass statistics over the thread's own values, then one trip through
        # the reduction levels merging (count, mean, M2) groups.
        count = R.valid_count(ctx)
        mean_local = x.reduce(cute.ReductionOp.ADD, init_val=0.0, reduction_profile=0) * cute.arch.rcp_approx(
            cute.arch.fmax(count, Float32(1.0))
        )
        d = x - mean_local
        if cutlass.const_expr(not t.even_n):
            d = R.zero_padding(ctx, d)  # padding columns are not part of the row
        m2_local = (d * d).reduce(cute.ReductionOp.ADD, init_val=0.0, reduction_profile=0)
        _, mean, m2 = R.row_reduce((count, mean_local, m2_local), R.count_mean_m2, t, scratch.at(ctx))
        rstd = cute.math.rsqrt(m2 / t.n + eps, fastmath=True)
        if cutlass.const_expr(self.save_stats):
            if ctx.row_ok & ctx.row_leader:
                mMean[ctx.row] = mean
                mRstd[ctx.row] = rstd
        rW, rB = R.columns_end(ctx, self.columns, (mW, mB), begun)
        R.store_row(ctx, (x - mean) * rstd * rW.load().to(Float32) + rB.load().to(Float32), mO)


launch = LayerNorm(R.RowKnobs())
