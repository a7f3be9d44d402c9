"""Cross-entropy per row for training: the loss, and each row's log-sum-exp for the backward
(reference_kernels/cross_entropy_bwd.py), from one read of the logits.

Kernel contract entry: `launch(mX, mTarget, mLoss, mLse, ignore_index, stream)`; mX (M, N) logits,
mTarget (M,) int64, mLoss and mLse (M,) fp32, ignore_index an int64 scalar.
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Int64

from reference_kernels import reduce as R
from reference_kernels.cross_entropy import CrossEntropy

OP = "cross_entropy_fwd"


class CrossEntropyForward(CrossEntropy):
    save_lse = True

    @cute.jit
    def __call__(
        self, mX: cute.Tensor, mTarget: cute.Tensor, mLoss: cute.Tensor, mLse: cute.Tensor, ignore_index: Int64, stream
    ):
        self._launch(mX, mTarget, mLoss, mLse, mLoss, mX, ignore_index, stream)


launch = CrossEntropyForward(R.RowKnobs())
