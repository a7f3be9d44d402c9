"""Log-softmax backward over the last dimension, from the forward's output y:
dx[m, :] = dy[m, :] - exp(y[m, :]) * sum(dy[m, :]).

Kernel contract entry: `launch(mdY, mY, mdX, stream)`; all (M, N). The softmax backward's kernel
with the log-softmax combine (reference_kernels/softmax_bwd.py).
"""

from __future__ import annotations

from reference_kernels import reduce as R
from reference_kernels.softmax_bwd import SoftmaxBackward

OP = "log_softmax_bwd"


class LogSoftmaxBackward(SoftmaxBackward):
    def __init__(self, knobs: R.RowKnobs = R.RowKnobs()) -> None:
        super().__init__(knobs, log=True)


launch = LogSoftmaxBackward(R.RowKnobs())
