"""RMSNorm for training: the output, and each row's rstd for the backward
(reference_kernels.rmsnorm_bwd.py), from one read of x.

Kernel contract entry: `launch(mX, mW, mO, mRstd, eps, stream)`; mX, mO (M, N), mW (N,),
mRstd (M,) fp32.
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Float32

from reference_kernels import reduce as R
from reference_kernels.rmsnorm import RMSNorm

OP = "rmsnorm_fwd"


class RMSNormForward(RMSNorm):
    save_rstd = True

    @cute.jit
    def __call__(self, mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor, mRstd: cute.Tensor, eps: Float32, stream):
        self._launch(mX, mW, mO, mRstd, eps, stream)


launch = RMSNormForward(R.RowKnobs())
