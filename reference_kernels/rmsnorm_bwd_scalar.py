"""RMSNorm backward for an upstream gradient that is one value c everywhere (a `.sum()`'s,
expanded), read as that value: xhat = x * rstd, dx = c (w - xhat * mean(w * xhat)) * rstd,
dw = c * sum over rows of xhat.

Kernel contract entry: `launch(mX, mdY, mW, mRstd, mdX, mdW, mWork, stream)`; mX, mdX (M, N), mdY
(1,) in x's dtype, mW, mdW (N,), mRstd (M,) fp32, mWork the fp32 workspace (WORKSPACE). The kernel
is rmsnorm_bwd.py's, with dy's loads left out (NormBackwardScalar).
"""

from __future__ import annotations

from reference_kernels import reduce as R
from reference_kernels.rmsnorm_bwd import WORKSPACE, NormBackwardScalar

OP = "rmsnorm_bwd_scalar"
__all__ = ["WORKSPACE", "launch"]

launch = NormBackwardScalar(R.RowKnobs())
