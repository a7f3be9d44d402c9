"""Log-softmax backward for an upstream gradient that is one value c everywhere (a `.sum()`'s,
expanded), read as that value: dx[m, :] = c - exp(y[m, :]) * c N.

Kernel contract entry: `launch(mY, mdY, mdX, stream)`; mY, mdX (M, N), mdY (1,) in y's dtype.
The kernel is softmax_bwd.py's SoftmaxBackwardScalar with the log-softmax combine.
"""

from __future__ import annotations

from reference_kernels import reduce as R
from reference_kernels.softmax_bwd import SoftmaxBackwardScalar

OP = "log_softmax_bwd_scalar"


class LogSoftmaxBackwardScalar(SoftmaxBackwardScalar):
    # (a class of its own, as log_softmax_bwd's: knobs swept or tested make `type(launch)(knobs)`)
    def __init__(self, knobs: R.RowKnobs = R.RowKnobs()) -> None:
        super().__init__(knobs, log=True)


launch = LogSoftmaxBackwardScalar(R.RowKnobs())
