"""Cross-entropy forward and backward in one pass over the logits (the memory-saving trick
of Liger and QuACK): each row's loss, and dlogits = (softmax(x) - onehot(target)) * scale from
the same registers, so a training step never reads the logits again (and may free them).

Kernel contract entry: `launch(mX, mTarget, mScale, mLoss, mdX, ignore_index, stream)`; mX, mdX
(M, N), mTarget (M,) int64, mScale (1,) fp32 (the upstream gradient of every row's loss: 1 for
a sum, 1 / kept rows for a mean, kept on the device so no one waits for it), mLoss (M,) fp32.
dx is 0 on ignored rows.
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Int64

from reference_kernels import reduce as R
from reference_kernels.cross_entropy import CrossEntropy

OP = "cross_entropy_fused"


class CrossEntropyFused(CrossEntropy):
    write_dx = True

    @cute.jit
    def __call__(
        self,
        mX: cute.Tensor,
        mTarget: cute.Tensor,
        mScale: cute.Tensor,
        mLoss: cute.Tensor,
        mdX: cute.Tensor,
        ignore_index: Int64,
        stream,
    ):
        self._launch(mX, mTarget, mLoss, mLoss, mScale, mdX, ignore_index, stream)


launch = CrossEntropyFused(R.RowKnobs())
