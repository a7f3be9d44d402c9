"""The fused cross-entropy (reference_kernels/cross_entropy_fused.py) and its total in one call:
each row's loss and dlogits for an upstream 1, then the rows' sum, their mean over the kept rows
and the mean's scale 1/kept (cross_entropy_total.py's), so a training step's loss takes one call,
not the kernel and the five small torch ops that sum and count after it (issue 47: their host
time).

Kernel contract entry: `launch(mX, mTarget, mLoss, mdX, mSum, mMean, mInvKept, mW, ignore_index,
stream)`; mX, mdX (M, N), mTarget (M,) int64, mLoss (M,) fp32, mSum, mMean, mInvKept (1,) fp32,
mW the workspace; kept as in cross_entropy_total.
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Int64

from reference_kernels import reduce as R
from reference_kernels.cross_entropy_total import WORKSPACE, CrossEntropyTotal

OP = "cross_entropy_fused_total"
__all__ = ["OP", "WORKSPACE", "launch"]


class CrossEntropyFusedTotal(CrossEntropyTotal):
    write_dx = unit_scale = True

    @cute.jit
    def __call__(
        self,
        mX: cute.Tensor,
        mTarget: cute.Tensor,
        mLoss: cute.Tensor,
        mdX: cute.Tensor,
        mSum: cute.Tensor,
        mMean: cute.Tensor,
        mInvKept: cute.Tensor,
        mW: cute.Tensor,
        ignore_index: Int64,
        stream,
    ):
        self._launch_total(mX, mTarget, mLoss, mdX, mSum, mMean, mInvKept, mW, ignore_index, stream)


launch = CrossEntropyFusedTotal(R.RowKnobs())
