"""Cross-entropy per row: loss[m] = logsumexp(x[m, :]) - x[m, target[m]], 0 where
target[m] == ignore_index, NaN where the target is outside [0, N) (torch raises there).

Kernel contract entry: `launch(mX, mTarget, mLoss, ignore_index, stream)`; mX (M, N) logits,
mTarget (M,) int64, mLoss (M,) fp32, ignore_index an int64 scalar.
"""

from __future__ import annotations

import functools

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from reference_kernels import reduce as R

OP = "cross_entropy"

# Nothing is written per element, so short rows want more rows per CTA in flight than the
# template's table gives: 16 threads a row up to N = 256 (H100: 2.12 vs 1.75 TB/s at N=256).
# (128 threads a row past 16K, with 256-thread CTAs, measured far worse: 1.73-2.16 TB/s.)
THREADS_PER_ROW = ((64, 8), (256, 16), (3072, 32), (6144, 64), (16384, 128), (None, 256))


class CrossEntropy:
    def __init__(self, knobs: R.RowKnobs = R.RowKnobs()) -> None:
        self.knobs = knobs

    @cute.jit
    def __call__(self, mX: cute.Tensor, mTarget: cute.Tensor, mLoss: cute.Tensor, ignore_index: Int64, stream):
        self.tiling = R.resolve_tiling(
            self.knobs, mX.element_type.width, mX.shape[1], threads_per_row_table=THREADS_PER_ROW
        )
        copy = R.row_tiled_copy(mX.element_type, self.tiling)
        R.launch_rows(self.kernel(mX, mTarget, mLoss, ignore_index, copy), self.tiling, mX.shape[0], stream)

    @cute.kernel
    def kernel(
        self, mX: cute.Tensor, mTarget: cute.Tensor, mLoss: cute.Tensor, ignore_index: Int64, copy: cute.TiledCopy
    ):
        t = self.tiling
        tidx, _, _ = cute.arch.thread_idx()
        smem = cutlass.memory.SmemAllocator()
        sX = R.allocate_staging(smem, t, mX.element_type)
        scratch_a = R.allocate_scratch(smem, t, 2 if cutlass.const_expr(self.knobs.online) else 1)
        scratch_b = R.allocate_scratch(smem, t, 1)
        R.init_cluster_barriers((scratch_a, scratch_b), t, tidx)

        target = cute.make_rmem_tensor(1, Int64)
        x_target = cute.make_rmem_tensor(1, Float32)
        target[0] = Int64(0)
        x_target[0] = Float32(0.0)
        fetch = functools.partial(fetch_target_logit, mX, mTarget, t.n, target, x_target)
        row = functools.partial(self.row, mLoss, ignore_index, scratch_a, scratch_b, target, x_target)
        R.for_each_row(t, copy, mX, sX, tidx, -Float32.inf, row, while_in_flight=fetch)

    @cute.jit
    def row(self, mLoss, ignore_index: Int64, scratch_a, scratch_b, target, x_target, ctx: R.RowContext, tXrX):
        t = self.tiling
        x = tXrX.load().to(Float32)
        m, s, _ = R.softmax_stats(x, t, self.knobs.online, scratch_a.at(ctx), scratch_b.at(ctx))
        if ctx.row_leader & ctx.row_ok:
            # (max - target logit) first: exact when the target is the max, however large
            loss = (m - x_target[0]) + cute.math.log(s, fastmath=True)
            if target[0] == ignore_index:
                loss = Float32(0.0)
            elif (target[0] < 0) | (target[0] >= t.n):
                loss = Float32(float("nan"))
            mLoss[ctx.row] = loss


@cute.jit
def fetch_target_logit(mX, mTarget, n: cutlass.Constexpr[int], target, x_target, ctx: R.RowContext):
    """The row leader's two dependent loads (target index, then its logit), issued while the
    row is in flight; an out-of-range target is clamped here and answered with NaN later."""
    if ctx.row_leader & ctx.row_ok:
        target[0] = mTarget[ctx.row]
        col = Int32(cutlass.max(cutlass.min(target[0], Int64(n - 1)), Int64(0)))
        x_target[0] = Float32(mX[ctx.row, col])


launch = CrossEntropy(R.RowKnobs())
