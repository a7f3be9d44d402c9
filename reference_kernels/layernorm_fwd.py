"""LayerNorm for training: the output, and each row's mean and rstd for the backward
(reference_kernels/layernorm_bwd.py), from one read of x.

Kernel contract entry: `launch(mX, mW, mB, mO, mMean, mRstd, eps, stream)`; mX, mO (M, N),
mW, mB (N,), mMean and mRstd (M,) fp32.
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Float32

from reference_kernels import reduce as R
from reference_kernels.layernorm import LayerNorm

OP = "layernorm_fwd"


class LayerNormForward(LayerNorm):
    save_stats = True

    @cute.jit
    def __call__(
        self,
        mX: cute.Tensor,
        mW: cute.Tensor,
        mB: cute.Tensor,
        mO: cute.Tensor,
        mMean: cute.Tensor,
        mRstd: cute.Tensor,
        eps: Float32,
        stream,
    ):
        self._launch(mX, mW, mB, mO, mMean, mRstd, eps, stream)


launch = LayerNormForward(R.RowKnobs())
