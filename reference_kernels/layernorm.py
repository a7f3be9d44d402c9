"""LayerNorm over the last dimension: out = (x - mean) * rsqrt(var + eps) * w + b (biased var).

Kernel contract entry: `launch(mX, mW, mB, mO, eps, stream)`; mX, mO (M, N), mW, mB (N,).
The variance is a second reduction over (x - mean)^2 of the row already in registers: two
trips through the reduction levels, but no cancellation as in E[x^2] - E[x]^2.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from reference_kernels import reduce as R

OP = "layernorm"


class LayerNorm:
    def __init__(self, knobs: R.RowKnobs = R.RowKnobs()) -> None:
        self.knobs = knobs

    @cute.jit
    def __call__(self, mX: cute.Tensor, mW: cute.Tensor, mB: cute.Tensor, mO: cute.Tensor, eps: Float32, stream):
        widest = max(mO.element_type.width, mW.element_type.width, mB.element_type.width)
        self.tiling = R.resolve_tiling(self.knobs, mX.element_type.width, mX.shape[1], widest, arrays=3)
        copy = R.row_tiled_copy(mX.element_type, self.tiling)
        R.launch_rows(self.kernel(mX, mW, mB, mO, eps, copy), self.tiling, mX.shape[0], stream)

    @cute.kernel
    def kernel(
        self, mX: cute.Tensor, mW: cute.Tensor, mB: cute.Tensor, mO: cute.Tensor, eps: Float32, copy: cute.TiledCopy
    ):
        t = self.tiling
        tidx, _, _ = cute.arch.thread_idx()
        ctx = R.RowContext.make(t, copy, mX, tidx)
        smem = cutlass.memory.SmemAllocator()
        sX = R.allocate_staging(smem, t, mX.element_type)
        scratch_mean = R.allocate_scratch(smem, t, 1)
        scratch_var = R.allocate_scratch(smem, t, 1)
        R.init_cluster_barriers((scratch_mean, scratch_var), t, tidx)

        w = R.load_columns(ctx, mW).load().to(Float32)
        b = R.load_columns(ctx, mB).load().to(Float32)
        x = R.load_row(ctx, mX, sX, fill=0.0).load().to(Float32)
        total = x.reduce(cute.ReductionOp.ADD, init_val=0.0, reduction_profile=0)
        (total,) = R.row_reduce((total,), R.add, t, scratch_mean)
        mean = total / t.n
        d = x - mean
        if cutlass.const_expr(not t.even_n):
            d = R.zero_padding(ctx, d)  # padding columns would add mean^2 each
        sq = (d * d).reduce(cute.ReductionOp.ADD, init_val=0.0, reduction_profile=0)
        (var,) = R.row_reduce((sq,), R.add, t, scratch_var, first_cluster_reduce=False)
        rstd = cute.math.rsqrt(var / t.n + eps, fastmath=True)
        R.store_row(ctx, d * rstd * w + b, mO)


launch = LayerNorm(R.RowKnobs())
