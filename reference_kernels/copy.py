"""Copy: out = x. The memory speed-of-light probe, built from the same load/store pieces
as every reduction kernel, so that it measures what those pieces can move.

Kernel contract entry: `launch(mX, mO, stream)`; mX, mO of shape (M, N).
"""

from __future__ import annotations

import functools

import cutlass.cute as cute

from reference_kernels import reduce as R

OP = "copy"


class Copy:
    def __init__(self, knobs: R.RowKnobs = R.RowKnobs(stage_smem=False)) -> None:
        self.knobs = knobs

    @cute.jit
    def __call__(self, mX: cute.Tensor, mO: cute.Tensor, stream):
        self.tiling = R.resolve_tiling(self.knobs, mX.element_type.width, mX.shape[1], mO.element_type.width)
        copy = R.row_tiled_copy(mX.element_type, self.tiling)
        R.launch_rows(self.kernel(mX, mO, copy), self.tiling, mX.shape[0], stream, waits=True)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mO: cute.Tensor, copy: cute.TiledCopy):
        tidx, _, sX, _ = R.begin_rows(self.tiling, mX.element_type)
        R.for_each_row(self.tiling, copy, mX, sX, tidx, 0.0, functools.partial(self.row, mO))

    @cute.jit
    def row(self, mO: cute.Tensor, ctx: R.RowContext, tXrX: cute.Tensor):
        R.store_row(ctx, tXrX.load(), mO)


launch = Copy()
