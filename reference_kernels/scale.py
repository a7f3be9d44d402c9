"""x times two values read on the device: out = x * (a[0] * b[0]). A fused loss's backward: the
gradient its forward wrote for an upstream 1, times the upstream gradient and the mean's 1/kept,
with no host sync and one launch (torch's `dx.mul_(g)` by a device scalar reads it through a
broadcast and ran at a quarter of the copy's speed on the H200: 250 us against 68 for 8192^2 bf16).

Kernel contract entry: `launch(mX, mA, mB, mOut, stream)`; mX, mOut (M, N), mA, mB (1,) fp32. Each
element is read before it is written by the same thread, so mOut may be mX (in place).
"""

from __future__ import annotations

import cutlass.cute as cute

from reference_kernels import map as M
from reference_kernels import reduce as R
from reference_kernels.row_plan import pick
from reference_kernels.tuning import rows as T

OP = "scale"


def times_both(xs: tuple, scalars: tuple) -> tuple:
    x, a, b = xs
    return (x * (a * b),)


_map = M.Map(times_both, ("full", "one", "one"))


class Scale:
    def __init__(self, knobs: R.RowKnobs = R.RowKnobs()) -> None:
        self.knobs = knobs

    @cute.jit
    def __call__(self, mX: cute.Tensor, mA: cute.Tensor, mB: cute.Tensor, mOut: cute.Tensor, stream):
        # (launched as the row kernels are, after whatever kernel came before it)
        dependent = self.knobs.dependent_launch
        _map.dependent = pick(T.DEPENDENT_LAUNCH, mX.shape[1]) if dependent is None else dependent
        _map((mX, mA, mB), (mOut,), (), stream)


launch = Scale(R.RowKnobs())
