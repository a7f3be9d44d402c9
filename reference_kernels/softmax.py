"""Softmax over the last dimension: out[m, :] = exp(x[m, :] - max) / sum(exp(x[m, :] - max)).

Kernel contract entry: `launch(mX, mO, stream)`; mX, mO of shape (M, N), same dtype or not.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import cutlass.cute as cute
from cutlass import Float32, const_expr

from reference_kernels import reduce as R
from reference_kernels.tuning import softmax as T

OP = "softmax"


class Softmax:
    def __init__(self, knobs: R.RowKnobs = R.RowKnobs()) -> None:
        self.knobs = knobs

    @cute.jit
    def __call__(self, mX: cute.Tensor, mO: cute.Tensor, stream):
        width, n = mX.element_type.width, mX.shape[1]
        self.tiling = R.resolve_tiling(self.knobs, width, n, mO.element_type.width)
        if const_expr(self.tiling.stage_smem and R.pick(T.STAGE_SMEM, staged_bytes(self.tiling, width)) == 0):
            self.tiling = R.resolve_tiling(replace(self.knobs, stage_smem=False), width, n, mO.element_type.width)
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
        _, s, e = R.softmax_stats(x, self.tiling, self.knobs.online, scratch_a.at(ctx), scratch_b.at(ctx))
        R.store_row(ctx, e * cute.arch.rcp_approx(s), mO)


def staged_bytes(t: R.RowTiling, width: int) -> int:
    """Shared memory a CTA's staged row tile takes."""
    return t.rows_per_cta * t.cols_per_cta * width // 8


launch = Softmax(R.RowKnobs(stage_smem=True))
