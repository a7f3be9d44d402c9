"""Softmax backward for an upstream gradient that is one value c everywhere (a `.sum()`'s,
expanded), read as that value: dx[m, :] = y[m, :] * (c - sum(c * y[m, :])).

Kernel contract entry: `launch(mY, mdY, mdX, stream)`; mY, mdX (M, N), mdY (1,) in y's dtype.
The kernel is softmax_bwd.py's SoftmaxBackwardScalar.
"""

from __future__ import annotations

from reference_kernels import reduce as R
from reference_kernels.softmax_bwd import SoftmaxBackwardScalar

OP = "softmax_bwd_scalar"

launch = SoftmaxBackwardScalar(R.RowKnobs())
