"""Softmax backward over the last dimension, from the forward's output:
dx[m, :] = y[m, :] * (dy[m, :] - sum(dy[m, :] * y[m, :])).

Kernel contract entry: `launch(mdY, mY, mdX, stream)`; all (M, N), same dtype or not.
`log_softmax_bwd` is the same kernel with y the log-softmax output: dx = dy - exp(y) * sum(dy).
"""

from __future__ import annotations

import functools

import cutlass
import cutlass.cute as cute
from cutlass import Float32, const_expr

from reference_kernels import reduce as R
from reference_kernels.tuning import softmax_bwd as T

OP = "softmax_bwd"


class SoftmaxBackward:
    def __init__(self, knobs: R.RowKnobs = R.RowKnobs(), log: bool = False) -> None:
        self.knobs = knobs
        self.log = log

    @cute.jit
    def __call__(self, mdY: cute.Tensor, mY: cute.Tensor, mdX: cute.Tensor, stream):
        widest = max(mY.element_type.width, mdX.element_type.width)
        # two rows live in registers at once (dy and y): the tables' slice per thread halves
        self.tiling = R.resolve_tiling(self.knobs, mdY.element_type.width, mdY.shape[1], widest, arrays=2)
        self.exp_first = self.log and R.pick_mode("LOG_EXP", T.LOG_EXP, self.tiling.n, ("after", "before")) == "before"
        copy = R.row_tiled_copy(mdY.element_type, self.tiling)
        R.launch_rows(self.kernel(mdY, mY, mdX, copy), self.tiling, mdY.shape[0], stream, waits=True)

    @cute.kernel
    def kernel(self, mdY: cute.Tensor, mY: cute.Tensor, mdX: cute.Tensor, copy: cute.TiledCopy):
        t = self.tiling
        tidx, _, sdY, (scratch,) = R.begin_rows(t, mdY.element_type, 1)
        # y's row slice, loaded into registers while dy's row is in flight (a trace-time
        # hand-over from the fetch to the row body of the same row tile)
        held: list = []
        fetch = functools.partial(load_into, mY, held)
        R.for_each_row(t, copy, mdY, sdY, tidx, 0.0, functools.partial(self.row, mdX, scratch, held), fetch)

    @cute.jit
    def row(self, mdX, scratch: R.ReductionScratch, held: list, ctx: R.RowContext, tXrdY):
        dy = tXrdY.load().to(Float32)
        y = held[-1].load().to(Float32)
        # padding columns read 0 in both rows: they add nothing to either sum
        if const_expr(self.log):
            part = dy.reduce(cute.ReductionOp.ADD, init_val=0.0, reduction_profile=0)
        else:
            part = (dy * y).reduce(cute.ReductionOp.ADD, init_val=0.0, reduction_profile=0)
        if const_expr(self.exp_first):
            tXrE = cute.make_rmem_tensor_like(held[-1], Float32)
            tXrE.store(y * R.LOG2_E)
            for i in cutlass.range_constexpr(cute.size(tXrE)):
                tXrE[i] = _exp2_here(tXrE[i])
        (total,) = R.row_reduce((part,), R.add, self.tiling, scratch.at(ctx))
        if const_expr(self.log):
            # exp(-inf) = 0 where the forward masked: dx = dy there, as torch has it
            e = tXrE.load() if const_expr(self.exp_first) else cute.math.exp2(y * R.LOG2_E, fastmath=True)
            R.store_row(ctx, dy - e * total, mdX)
        else:
            R.store_row(ctx, y * (dy - total), mdX)


class SoftmaxBackwardScalar(SoftmaxBackward):
    """The backward for an upstream gradient that is one value c everywhere, read as that value:
    dx = y * (c - sum(c * y)) (with `log`, c - exp(y) * c N). `loss.sum().backward()` hands the
    backward its gradient expanded from one element, every stride 0; the rows kernel above needs
    it dense first, one more launch a training step (issue 47). Contract entry:
    `launch(mY, mdY, mdX, stream)`, mdY (1,) in y's dtype."""

    @cute.jit
    def __call__(self, mY: cute.Tensor, mdY: cute.Tensor, mdX: cute.Tensor, stream):
        widest = max(mY.element_type.width, mdX.element_type.width)
        # one row in registers (y), as in the forward
        self.tiling = R.resolve_tiling(self.knobs, mY.element_type.width, mY.shape[1], widest)
        copy = R.row_tiled_copy(mY.element_type, self.tiling)
        R.launch_rows(self.kernel(mY, mdY, mdX, copy), self.tiling, mY.shape[0], stream, waits=True)

    @cute.kernel
    def kernel(self, mY: cute.Tensor, mdY: cute.Tensor, mdX: cute.Tensor, copy: cute.TiledCopy):
        tidx, _, sY, (scratch,) = R.begin_rows(self.tiling, mY.element_type, 1)
        R.for_each_row(self.tiling, copy, mY, sY, tidx, 0.0, functools.partial(self.row, mdY, mdX, scratch))

    @cute.jit
    def row(self, mdY: cute.Tensor, mdX: cute.Tensor, scratch: R.ReductionScratch, ctx: R.RowContext, tXrY):
        c = Float32(mdY[0])
        y = tXrY.load().to(Float32)
        # padding columns: y reads 0 (softmax's product adds nothing), and the log's sum of c
        # counts only the columns inside the row
        if const_expr(self.log):
            part = c * R.valid_count(ctx)
        else:
            part = (y * c).reduce(cute.ReductionOp.ADD, init_val=0.0, reduction_profile=0)
        # (the reduction runs either way: with row_loop > 1 it keeps the row tiles in step)
        (total,) = R.row_reduce((part,), R.add, self.tiling, scratch.at(ctx))
        if const_expr(self.log):
            R.store_row(ctx, c - cute.math.exp2(y * R.LOG2_E, fastmath=True) * total, mdX)
        else:
            R.store_row(ctx, y * (c - total), mdX)


def _exp2_here(v: Float32) -> Float32:
    """2^v where it is written: as inline PTX, which the compiler keeps in order with the
    reduction's own (a plain exp2 was sunk past the reduction's wait to its one use). CuTe DSL's
    cute.arch.exp2 is this, but deprecated for cute.math.exp2, which the compiler may move."""
    return cute.arch.inline_ptx("ex2.approx.ftz.f32 {$w0}, {$r0};", write_only_types=[Float32], read_only_args=[v])


@cute.jit
def load_into(mY: cute.Tensor, held: list, ctx: R.RowContext):
    held.append(R.load_row(ctx, mY, None, 0.0))


launch = SoftmaxBackward(R.RowKnobs())
