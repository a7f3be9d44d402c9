"""The cross-entropy loss and its total in one call: each row's loss (reference_kernels/
cross_entropy.py), then their sum, their mean over the kept rows and 1/kept. A loss asked for no
gradient (an eval loop, `torch.no_grad()`) took the per-row kernel and five small torch ops after
it, each a launch of host time (issue 47). cross_entropy_fused_total is this with dlogits written
too.

Two launches: the row kernel, each CTA of which also folds its rows' losses and kept count into
its partial in the workspace, then one CTA that folds the partials in a fixed order (no atomics:
the same bits every run). The whole-tensor template (total.py) took two launches of its own
after the row kernel, a partials pass over the losses and the fold: each about 6 us of a call's
host time. The workspace is undefined on entry, so a last-CTA finish inside the row kernel would
need a counter zeroed by another launch.

Kernel contract entry: `launch(mX, mTarget, mLoss, mSum, mMean, mInvKept, mW, ignore_index,
stream)`; mX (M, N), mTarget (M,) int64, mLoss (M,) fp32, mSum, mMean, mInvKept (1,) fp32, mW the
workspace. kept = the rows whose target is not ignore_index, at least 1 (so a batch of ignored
rows has a mean of 0, not NaN). The count is kept in fp32: exact for M <= 2^24.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from reference_kernels import reduce as R
from reference_kernels.cross_entropy import CrossEntropy

OP = "cross_entropy_total"
# The CTAs' partials the workspace holds, (sum, kept) each: M up to 2^18 row tiles. Past that
# (M of 2^18 rows and more at one row a CTA) the finish folds the rows' losses themselves.
PARTS = 1 << 18
WORKSPACE = 2 * PARTS
FINISH_THREADS = 1024


def sum_mean_inv(acc: tuple) -> tuple:
    total, kept = acc[0], cutlass.max(acc[1], Float32(1.0))
    return total, total / kept, Float32(1.0) / kept


class CrossEntropyTotal(CrossEntropy):
    fold_total = True

    def __init__(self, knobs: R.RowKnobs = R.RowKnobs(), parts: int = PARTS) -> None:
        super().__init__(knobs)
        self.parts = parts  # (fewer in a test: the finish's fold of the rows themselves)

    @cute.jit
    def __call__(
        self,
        mX: cute.Tensor,
        mTarget: cute.Tensor,
        mLoss: cute.Tensor,
        mSum: cute.Tensor,
        mMean: cute.Tensor,
        mInvKept: cute.Tensor,
        mW: cute.Tensor,
        ignore_index: Int64,
        stream,
    ):
        self._launch_total(mX, mTarget, mLoss, mX, mSum, mMean, mInvKept, mW, ignore_index, stream)

    def _launch_total(self, mX, mTarget, mLoss, mdX, mSum, mMean, mInvKept, mW, ignore_index, stream) -> None:
        # (mdX is written only where write_dx is set: cross_entropy_fused_total)
        self._launch(mX, mTarget, mLoss, mLoss, mLoss, mdX, ignore_index, stream, mW)
        t = self.tiling
        tiles = cute.ceil_div(cute.ceil_div(Int64(mX.shape[0]), t.rows_per_cta), t.row_loop)
        self.finish(mLoss, mTarget, mSum, mMean, mInvKept, mW, tiles * t.cluster_n, ignore_index).launch(
            grid=[1, 1, 1], block=[FINISH_THREADS, 1, 1], stream=stream, use_pdl=t.dependent_launch
        )

    @cute.kernel
    def finish(
        self,
        mLoss: cute.Tensor,
        mTarget: cute.Tensor,
        mSum: cute.Tensor,
        mMean: cute.Tensor,
        mInvKept: cute.Tensor,
        mW: cute.Tensor,
        parts: Int64,
        ignore_index: Int64,
    ):
        """The partials (or, past PARTS of them, the rows) folded in a fixed order: thread t
        folds items t, t + T, ..., then the CTA folds its threads in order."""
        if cutlass.const_expr(self.tiling.dependent_launch):
            cute.arch.griddepcontrol_wait()
        tidx, _, _ = cute.arch.thread_idx()
        from_parts = parts <= self.parts
        items = cutlass.select_(from_parts, parts, Int64(mLoss.shape[0]))
        acc = cute.make_rmem_tensor(2, Float32)
        acc.fill(0.0)
        for i in cutlass.range(Int32((items + FINISH_THREADS - 1) // FINISH_THREADS), unroll=1):
            j = Int64(i) * FINISH_THREADS + tidx
            if j < items:
                if from_parts:
                    acc[0] = acc[0] + mW[j * 2]
                    acc[1] = acc[1] + mW[j * 2 + 1]
                else:
                    acc[0] = acc[0] + mLoss[j]
                    acc[1] = acc[1] + cutlass.select_(mTarget[j] == ignore_index, Float32(0.0), Float32(1.0))
        total = sum_mean_inv(R.block_fold((acc[0], acc[1]), R.add, tidx, FINISH_THREADS))
        if tidx == 0:
            mSum[0], mMean[0], mInvKept[0] = total


launch = CrossEntropyTotal(R.RowKnobs())
