"""Cross-entropy per row: loss[m] = logsumexp(x[m, :]) - x[m, target[m]], 0 where
target[m] == ignore_index, NaN where the target is outside [0, N) (torch raises there).

Kernel contract entry: `launch(mX, mTarget, mLoss, ignore_index, stream)`; mX (M, N) logits,
mTarget (M,) int64, mLoss (M,) fp32, ignore_index an int64 scalar.
"""

from __future__ import annotations

import functools

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from reference_kernels import reduce as R

OP = "cross_entropy"

# Where a row's target logit comes from, by N. "load": the row leader reads the target index
# and then the logit while the row is in flight; on a short row that chain hides behind the
# row. "registers": every thread reads the index, and the one holding that column takes the
# logit from its registers; on a long row the leader's chain would hold up the whole row's
# reduction. H100 bf16, TB/s (load / registers, from two runs a few minutes apart): 32768x512
# 2.56/2.46, 32768x1024 2.70/2.68, 4096x65536 2.99/3.06, 1024x262144 2.87/2.98. "smem": the
# leader reads the index while the row is in flight and the logit from the staged row once it
# has landed (no second trip to memory); only where a row is one warp's, staged, one tile a
# CTA ("load" elsewhere). H100 32768xN bf16, TB/s load / smem, each twice (QuACK)
# (evals/results/h100-2026-11-24e, ce3.txt): 256 2.118, 2.112 / 1.952, 1.951 (2.191); 512 2.387,
# 2.386 / 2.488, 2.493 (2.563); 1024 2.733, 2.716 / 2.782, 2.766 (2.781); 2048 2.906, 2.919 /
# 2.936, 2.944 (2.947).
TARGET_LOGIT: tuple[tuple[int | None, str], ...] = ((256, "load"), (3072, "smem"), (None, "registers"))


class CrossEntropy:
    save_lse = False  # also write each row's log-sum-exp (what the backward needs): cross_entropy_fwd
    # also write dlogits from the registers the loss came from: cross_entropy_fused
    write_dx = False

    def __init__(self, knobs: R.RowKnobs = R.RowKnobs()) -> None:
        self.knobs = knobs

    @cute.jit
    def __call__(self, mX: cute.Tensor, mTarget: cute.Tensor, mLoss: cute.Tensor, ignore_index: Int64, stream):
        # (no lse, no dlogits: mLse, mScale and mdX are never touched)
        self._launch(mX, mTarget, mLoss, mLoss, mLoss, mX, ignore_index, stream)

    def _launch(self, mX, mTarget, mLoss, mLse, mScale, mdX, ignore_index, stream) -> None:
        # The template's threads-per-row table. (16 threads a row up to N = 256 paid while the
        # warp level merged (max, sum) pairs; with the warp's max taken first, one vector a
        # thread is the shorter path: H100 32768x256, 2.10 vs 1.94 TB/s. 128 threads a row past
        # 16K, with 256-thread CTAs, measured far worse: 1.73-2.16 TB/s.)
        self.tiling = t = R.resolve_tiling(self.knobs, mX.element_type.width, mX.shape[1])
        # (dlogits need every thread of the row to know its target: "load" tells the leader only)
        self.logit_from = "registers" if self.write_dx else R.pick(TARGET_LOGIT, t.n)
        if self.logit_from == "smem" and not (
            t.stage_smem and t.row_loop == 1 and t.cluster_n == 1 and t.threads_per_row <= R.WARP
        ):
            self.logit_from = "load"
        self.from_registers = self.logit_from == "registers"
        copy = R.row_tiled_copy(mX.element_type, t)
        kernel = self.kernel(mX, mTarget, mLoss, mLse, mScale, mdX, ignore_index, copy)
        R.launch_rows(kernel, t, mX.shape[0], stream)

    @cute.kernel
    def kernel(
        self,
        mX: cute.Tensor,
        mTarget: cute.Tensor,
        mLoss: cute.Tensor,
        mLse: cute.Tensor,
        mScale: cute.Tensor,
        mdX: cute.Tensor,
        ignore_index: Int64,
        copy: cute.TiledCopy,
    ):
        t = self.tiling
        tidx, _, _ = cute.arch.thread_idx()
        smem = cutlass.memory.SmemAllocator()
        sX = R.allocate_staging(smem, t, mX.element_type)
        scratch_a = R.allocate_scratch(smem, t, 2 if cutlass.const_expr(self.knobs.online) else 1)
        scratch_b = R.allocate_scratch(smem, t, 1)
        R.init_cluster_barriers((scratch_a, scratch_b), t, tidx)

        target = cute.make_rmem_tensor(1, Int64)
        x_target = cute.make_rmem_tensor(1, Float32)
        target[0] = Int64(0)
        x_target[0] = Float32(0.0)
        if cutlass.const_expr(self.from_registers):
            fetch = functools.partial(load_target, mTarget, target)
        elif cutlass.const_expr(self.logit_from == "smem"):
            fetch = functools.partial(load_target_index, mTarget, target)
        else:
            fetch = functools.partial(load_target_logit, mX, mTarget, t.n, target, x_target)
        scale = Float32(mScale[0]) if cutlass.const_expr(self.write_dx) else Float32(0.0)
        row = functools.partial(
            self.row, mLoss, mLse, mdX, sX, scale, ignore_index, scratch_a, scratch_b, target, x_target
        )
        R.for_each_row(t, copy, mX, sX, tidx, -Float32.inf, row, while_in_flight=fetch)

    @cute.jit
    def row(
        self, mLoss, mLse, mdX, sX, scale: Float32, ignore_index: Int64, scratch_a, scratch_b, target, x_target,
        ctx: R.RowContext, tXrX,
    ):  # fmt: skip
        t = self.tiling
        x = tXrX.load().to(Float32)
        ignored = target[0] == ignore_index
        outside = (target[0] < 0) | (target[0] >= t.n)
        holds = ctx.row_leader
        if cutlass.const_expr(self.from_registers):
            col = Int32(cutlass.select_(outside, Int64(-1), target[0]))
            holds, x_target[0] = R.value_at_column(ctx, tXrX, col)
        m, s, _ = R.softmax_stats(x, t, self.knobs.online, scratch_a.at(ctx), scratch_b.at(ctx))
        if cutlass.const_expr(self.logit_from == "smem"):
            # each lane has waited on its own copies; the warp barrier lets the leader see the
            # others' (the row is this warp's, and nothing refills the buffer: one tile a CTA).
            # Read last, as "load" uses its logit: the index's latency hides behind the row's.
            cute.arch.sync_warp()
            if ctx.row_leader & ctx.row_ok:
                at = clamped_column(target[0], t.n)
                x_target[0] = Float32(sX[ctx.row - ctx.tile[0] * t.rows_per_cta, at])
        if cutlass.const_expr(self.save_lse or self.write_dx):
            lse = m + cute.math.log(s, fastmath=True)
            if cutlass.const_expr(self.save_lse):
                if ctx.row_ok & ctx.row_leader:
                    mLse[ctx.row] = lse
            if cutlass.const_expr(self.write_dx):
                write_dlogits(ctx, tXrX, lse, cutlass.select_(ignored, Float32(0.0), scale), target[0], mdX)
        if ctx.row_ok:
            # one writer a row: the row leader for a loss without a logit, else the holder
            if ignored | outside:
                if ctx.row_leader:
                    mLoss[ctx.row] = cutlass.select_(ignored, Float32(0.0), Float32(float("nan")))
            elif holds:
                # (max - target logit) first: exact when the target is the max, however large
                mLoss[ctx.row] = (m - x_target[0]) + cute.math.log(s, fastmath=True)


@cute.jit
def load_target(mTarget, target, ctx: R.RowContext):
    """Every thread's copy of its row's target index, read while the row is in flight."""
    if ctx.row_ok:
        target[0] = mTarget[ctx.row]


def clamped_column(target: Int64, n: int) -> Int32:
    """The target as a column inside [0, N), where the logit is read from whatever the target
    (one outside is answered with NaN later, not read outside the row)."""
    return Int32(cutlass.max(cutlass.min(target, Int64(n - 1)), Int64(0)))


@cute.jit
def load_target_index(mTarget, target, ctx: R.RowContext):
    """The row leader's copy of its row's target index, read while the row is in flight."""
    if ctx.row_leader & ctx.row_ok:
        target[0] = mTarget[ctx.row]


@cute.jit
def load_target_logit(mX, mTarget, n: cutlass.Constexpr[int], target, x_target, ctx: R.RowContext):
    """The row leader's two dependent loads (target index, then its logit), issued while the
    row is in flight; an out-of-range target is clamped here and answered with NaN later."""
    if ctx.row_leader & ctx.row_ok:
        target[0] = mTarget[ctx.row]
        x_target[0] = Float32(mX[ctx.row, clamped_column(target[0], n)])


@cute.jit
def write_dlogits(ctx: R.RowContext, tXrX: cute.Tensor, lse: Float32, g: Float32, target: Int64, mdX: cute.Tensor):
    """dx = (exp(x - lse) - onehot(target)) * g for the thread's slice of its row (no onehot
    for a target outside [0, N): its loss is NaN already)."""
    x = tXrX.load().to(Float32)
    # (x - lse) first: exact 0 at a row whose one logit dominates
    p = cute.math.exp2((x - lse) * R.LOG2_E, fastmath=True)
    tXrG = cute.make_rmem_tensor_like(tXrX, Float32)
    tXrG.store(p * g)
    col = Int32(cutlass.select_((target < 0) | (target >= ctx.tiling.n), Int64(-1), target))
    holds, _ = R.value_at_column(ctx, tXrX, col)
    if holds:
        for i in cutlass.range_constexpr(cute.size(tXrG)):
            if ctx.tXcX[i][1] == col:
                tXrG[i] = tXrG[i] - g
    R.store_row(ctx, tXrG.load(), mdX)


launch = CrossEntropy(R.RowKnobs())
