"""Log-softmax over the last dimension: out[m, :] = x[m, :] - max - log(sum(exp(x[m, :] - max))).

Kernel contract entry: `launch(mX, mO, stream)`; mX, mO of shape (M, N).
"""

from __future__ import annotations

import functools

import cutlass.cute as cute
from cutlass import Float32, const_expr

from reference_kernels import reduce as R

OP = "log_softmax"


class LogSoftmax:
    def __init__(self, knobs: R.RowKnobs = R.RowKnobs()) -> None:
        self.knobs = knobs

    @cute.jit
    def __call__(self, mX: cute.Tensor, mO: cute.Tensor, stream):
        self.tiling = R.resolve_tiling(self.knobs, mX.element_type.width, mX.shape[1], mO.element_type.width)
        copy = R.row_tiled_copy(mX.element_type, self.tiling)
        R.launch_rows(self.kernel(mX, mO, copy), self.tiling, mX.shape[0], stream, waits=True)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mO: cute.Tensor, copy: cute.TiledCopy):
        t = self.tiling
        tidx, _, sX, (scratch_a, scratch_b) = R.begin_rows(
            t, mX.element_type, 2 if const_expr(self.knobs.online) else 1, 1
        )
        R.for_each_row(t, copy, mX, sX, tidx, -Float32.inf, functools.partial(self.row, mO, scratch_a, scratch_b))

    @cute.jit
    def row(self, mO, scratch_a: R.ReductionScratch, scratch_b: R.ReductionScratch, ctx: R.RowContext, tXrX):
        x = tXrX.load().to(Float32)
        m, s, _ = R.softmax_stats(x, self.tiling, self.knobs.online, scratch_a.at(ctx), scratch_b.at(ctx))
        # (x - max) first: exact at the max, so its output is -log(s) even for |x| ~ 1e3
        R.store_row(ctx, (x - m) - cute.math.log(s, fastmath=True), mO)


launch = LogSoftmax(R.RowKnobs())
