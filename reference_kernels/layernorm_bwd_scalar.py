"""LayerNorm backward for an upstream gradient that is one value c everywhere (a `.sum()`'s,
expanded), read as that value: the LayerNorm backward with dy = c (dx, dw, db).

Kernel contract entry: `launch(mX, mdY, mW, mMean, mRstd, mdX, mdW, mdB, mWork, stream)`; mdY (1,)
in x's dtype, the rest as layernorm_bwd's. The kernel is layernorm_bwd.py's LayerNormBackwardScalar.
"""

from __future__ import annotations

from reference_kernels import reduce as R
from reference_kernels.layernorm_bwd import WORKSPACE, LayerNormBackwardScalar

OP = "layernorm_bwd_scalar"
__all__ = ["WORKSPACE", "launch"]

launch = LayerNormBackwardScalar(R.RowKnobs())
