"""The cross-entropy loss and its total in one call: each row's loss (reference_kernels/
cross_entropy.py), then the whole-tensor template (total.py) folds the losses and counts the kept
rows: their sum, their mean over the kept rows and 1/kept. A loss asked for no gradient (an eval
loop, `torch.no_grad()`) took the per-row kernel and five small torch ops after it, each a launch
of host time (issue 47). cross_entropy_fused_total is this with dlogits written too.

Kernel contract entry: `launch(mX, mTarget, mLoss, mSum, mMean, mInvKept, mW, ignore_index,
stream)`; mX (M, N), mTarget (M,) int64, mLoss (M,) fp32, mSum, mMean, mInvKept (1,) fp32, mW the
workspace. kept = the rows whose target is not ignore_index, at least 1 (so a batch of ignored
rows has a mean of 0, not NaN). The count compares targets in fp32: exact for N <= 2^24.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int64

from reference_kernels import reduce as R
from reference_kernels import strided as S
from reference_kernels import total as T
from reference_kernels.cross_entropy import CrossEntropy
from reference_kernels.tuning import cross_entropy as CE

OP = "cross_entropy_total"
WORKSPACE = T.WORKSPACE  # the total's partials


def kept_loss(xs: tuple, scalars: tuple) -> tuple:
    loss, target = xs
    (ignore_index,) = scalars
    return loss, cutlass.select_(target != Float32(ignore_index), Float32(1.0), Float32(0.0))


def sum_mean_inv(acc: tuple, rows: Float32, count: Float32) -> tuple:
    total, kept = acc[0], cutlass.max(acc[1], Float32(1.0))
    return total, total / kept, Float32(1.0) / kept


_total = T.TotalReduce(
    kept_loss, S.add, (0.0, 0.0), sum_mean_inv, ("full", "full"), knobs=T.TotalKnobs(**CE.TOTAL_KNOBS)
)


class CrossEntropyTotal(CrossEntropy):
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
        self._launch(mX, mTarget, mLoss, mLoss, mLoss, mdX, ignore_index, stream)
        _total.dependent = self.tiling.dependent_launch
        _total((mLoss, mTarget), (mSum, mMean, mInvKept), (ignore_index,), mW, stream)


launch = CrossEntropyTotal(R.RowKnobs())
