"""Cross-entropy backward per row, from the forward's log-sum-exp:
dx[m, :] = (exp(x[m, :] - lse[m]) - onehot(target[m])) * dloss[m], 0 where target[m] == ignore_index.

Kernel contract entry: `launch(mX, mTarget, mLse, mdLoss, mdX, ignore_index, stream)`; mX, mdX (M, N),
mTarget (M,) int64, mLse and mdLoss (M,) fp32, ignore_index an int64 scalar. No reduction: the
forward's lse carries the row's statistics, so each row is read once and written once.
"""

from __future__ import annotations

import functools

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int64

from reference_kernels import reduce as R
from reference_kernels.cross_entropy import softmax_from_lse, write_dlogits
from reference_kernels.tuning import cross_entropy_bwd as T
from reference_kernels.tuning import rows

OP = "cross_entropy_bwd"


class CrossEntropyBackward:
    def __init__(self, knobs: R.RowKnobs = R.RowKnobs()) -> None:
        self.knobs = knobs

    @cute.jit
    def __call__(
        self,
        mX: cute.Tensor,
        mTarget: cute.Tensor,
        mLse: cute.Tensor,
        mdLoss: cute.Tensor,
        mdX: cute.Tensor,
        ignore_index: Int64,
        stream,
    ):
        threads = rows.THREADS_PER_ROW if mX.element_type.width <= 16 else T.THREADS_PER_ROW_32BIT
        self.tiling = R.resolve_tiling(self.knobs, mX.element_type.width, mX.shape[1], mdX.element_type.width,
                                       threads_per_row_table=threads)  # fmt: skip
        copy = R.row_tiled_copy(mX.element_type, self.tiling)
        R.launch_rows(
            self.kernel(mX, mTarget, mLse, mdLoss, mdX, ignore_index, copy),
            self.tiling,
            mX.shape[0],
            stream,
            waits=True,
        )

    @cute.kernel
    def kernel(
        self,
        mX: cute.Tensor,
        mTarget: cute.Tensor,
        mLse: cute.Tensor,
        mdLoss: cute.Tensor,
        mdX: cute.Tensor,
        ignore_index: Int64,
        copy: cute.TiledCopy,
    ):
        t = self.tiling
        tidx, _, _ = cute.arch.thread_idx()
        R.await_previous_grid(self.tiling)
        smem = cutlass.memory.SmemAllocator()
        sX = R.allocate_staging(smem, t, mX.element_type)
        # the row's three scalars, read by every thread of the row while the row is in flight
        target = cute.make_rmem_tensor(1, Int64)
        stats = cute.make_rmem_tensor(2, Float32)  # (lse, dloss)
        target[0] = Int64(0)
        stats[0] = Float32(0.0)
        stats[1] = Float32(0.0)
        fetch = functools.partial(load_row_scalars, mTarget, mLse, mdLoss, target, stats)
        row = functools.partial(self.row, mdX, ignore_index, target, stats)
        R.for_each_row(t, copy, mX, sX, tidx, 0.0, row, fetch)

    @cute.jit
    def row(self, mdX, ignore_index: Int64, target, stats, ctx: R.RowContext, tXrX):
        # an ignored row's gradient is 0; so is its dloss (torch's mean divides by the kept
        # rows only), but a caller's dloss need not be: the kernel zeroes it itself
        g = cutlass.select_(target[0] == ignore_index, Float32(0.0), stats[1])
        write_dlogits(ctx, tXrX, softmax_from_lse(tXrX, stats[0]), g, g, target[0], mdX, every=False)


@cute.jit
def load_row_scalars(mTarget, mLse, mdLoss, target, stats, ctx: R.RowContext):
    if ctx.row_ok:
        target[0] = mTarget[ctx.row]
        stats[0] = Float32(mLse[ctx.row])
        stats[1] = Float32(mdLoss[ctx.row])


launch = CrossEntropyBackward(R.RowKnobs())
