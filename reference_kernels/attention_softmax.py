"""Flash attention's softmax, on a kernel's score and output accumulators in registers: the
running max and sum of each query row, the output's rescaling, and the final normalisation with
the log-sum-exp. Written once for the attention kernels (mma.sync and WGMMA accumulators have
other layouts, the same rows: each kernel passes (rows, cols) views of its own; `mma_rows_cols`
makes that view of an mma.sync accumulator)."""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from reference_kernels import reduce as R


def mma_rows_cols(acc: cute.Tensor) -> cute.Tensor:
    """An mma accumulator ((2, 2), MMA_M, MMA_N) seen as (rows, cols) of the thread's values:
    an m16n8 atom gives a thread 2 rows (8 apart) of 2 adjacent columns."""
    flat = cute.make_layout(acc.layout.shape)
    rows_cols = cute.make_layout(
        ((flat.shape[0][1], flat.shape[1]), (flat.shape[0][0], flat.shape[2])),
        stride=((flat.stride[0][1], flat.stride[1]), (flat.stride[0][0], flat.stride[2])),
    )
    return cute.make_tensor(acc.iterator, cute.composition(acc.layout, rows_cols))


@cute.jit
def online_softmax(
    s, o, row_max, row_sum, tScS, j: Int32, m_block: Int32, scale_log2: Float32,
    bm: cutlass.Constexpr, bn: cutlass.Constexpr, n: cutlass.Constexpr, causal: cutlass.Constexpr,
):  # fmt: skip
    """Fold key tile j's scores `s` into the running max and sum, rescale the output `o` so
    far, and leave exp(s - max) in `s`."""
    row_scale = cute.make_rmem_tensor(cute.size(s, mode=[0]), Float32)
    fold_scores(s, row_max, row_sum, row_scale, tScS, j, m_block, scale_log2, bm, bn, n, causal)
    rescale_rows(o, row_scale)


@cute.jit
def fold_scores(
    s, row_max, row_sum, row_scale, tScS, j: Int32, m_block: Int32, scale_log2: Float32,
    bm: cutlass.Constexpr, bn: cutlass.Constexpr, n: cutlass.Constexpr, causal: cutlass.Constexpr,
):  # fmt: skip
    """The online softmax without the output: fold key tile j's scores `s` into the running
    max and sum, leave exp(s - max) in `s` and the factor the output so far must be scaled by
    in `row_scale` (kept apart so a kernel can scale its output once the previous tile's
    P V, still in flight while this runs, has landed). Keys past N (and, causal, past the
    query) are -inf."""
    masked = (j + 1) * bn > n
    if const_expr(causal):
        masked = masked | ((j + 1) * bn > m_block * bm)
    for r in cutlass.range_constexpr(cute.size(s, mode=[0])):
        if masked:
            row = tScS[r, 0][0]
            for c in cutlass.range_constexpr(cute.size(s, mode=[1])):
                col = tScS[0, c][1] + j * bn
                out = col >= n
                if const_expr(causal):
                    out = out | (col > row)
                if out:
                    s[r, c] = Float32(-math.inf)
        (tile_max,) = R.warp_reduce((s[r, None].load().reduce(cute.ReductionOp.MAX, Float32(-math.inf), 0),), R.fmax, 4)
        new_max = cute.arch.fmax(row_max[r], tile_max)
        # a row with every key so far masked keeps max -inf: exp of (-inf - 0) is 0, not NaN
        safe = cutlass.select_(new_max == Float32(-math.inf), Float32(0.0), new_max)
        p = cute.math.exp2(s[r, None].load() * scale_log2 - safe * scale_log2, fastmath=True)
        old = cute.math.exp2(row_max[r] * scale_log2 - safe * scale_log2, fastmath=True)
        row_sum[r] = row_sum[r] * old + p.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
        row_scale[r] = old
        row_max[r] = new_max
        s[r, None] = p


@cute.jit
def rescale_rows(o, row_scale):
    for r in cutlass.range_constexpr(cute.size(o, mode=[0])):
        o[r, None] = o[r, None].load() * row_scale[r]


@cute.jit
def normalize_rows(o, row_max, row_sum, tScS, mLse: cute.Tensor, head: Int32, n: cutlass.Constexpr, scale: Float32):
    """o /= the row's sum (0 for a row with no key); lse = max * scale + log(sum), written by
    the first lane of each quad (the four lanes that share a row)."""
    lane = cute.arch.lane_idx()
    for r in cutlass.range_constexpr(cute.size(o, mode=[0])):
        (total,) = R.warp_reduce((row_sum[r],), R.add, 4)
        inv = cutlass.select_(total == 0.0, Float32(0.0), cute.arch.rcp_approx(total))
        o[r, None] = o[r, None].load() * inv
        row = tScS[r, 0][0]
        if lane % 4 == 0 and row < n:
            lse = row_max[r] * scale + cute.math.log(total, fastmath=True)
            mLse[head, row] = cutlass.select_(total == 0.0, Float32(-math.inf), lse)
