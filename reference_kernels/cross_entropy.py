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
from reference_kernels.tuning import cross_entropy as T

OP = "cross_entropy"


class CrossEntropy:
    save_lse = False  # also write each row's log-sum-exp (what the backward needs): cross_entropy_fwd
    # also write dlogits from the registers the loss came from: cross_entropy_fused
    write_dx = False
    unit_scale = False  # dlogits for an upstream 1, mScale never read: cross_entropy_fused_total
    # also fold the CTA's rows' losses and kept count into its partial in the workspace
    # (cross_entropy_total.py finishes them): the total without a launch over the losses
    fold_total = False
    # the grid is one CTA: it writes the sum, mean and 1/kept itself (cross_entropy_total.py)
    total_in_cta = False

    def __init__(self, knobs: R.RowKnobs = R.RowKnobs()) -> None:
        self.knobs = knobs

    @cute.jit
    def __call__(self, mX: cute.Tensor, mTarget: cute.Tensor, mLoss: cute.Tensor, ignore_index: Int64, stream):
        # (no lse, no dlogits: mLse, mScale and mdX are never touched)
        self._launch(mX, mTarget, mLoss, mLoss, mLoss, mX, ignore_index, stream)

    def _launch(self, mX, mTarget, mLoss, mLse, mScale, mdX, ignore_index, stream, mW=None, totals=None) -> None:
        # The template's threads-per-row table. (16 threads a row up to N = 256 paid while the
        # warp level merged (max, sum) pairs; with the warp's max taken first, one vector a
        # thread is the shorter path: H100 32768x256, 2.10 vs 1.94 TB/s. 128 threads a row past
        # 16K, with 256-thread CTAs, measured far worse: 1.73-2.16 TB/s.)
        self.tiling = t = R.resolve_tiling(self.knobs, mX.element_type.width, mX.shape[1])
        fused = T.FUSED_TARGET_LOGIT if mX.element_type.width <= 16 else T.FUSED_TARGET_LOGIT_32BIT
        self.logit_from = R.pick_mode("TARGET_LOGIT", fused if self.write_dx else T.TARGET_LOGIT, t.n,
                                      ("load", "smem", "registers"))  # fmt: skip
        if self.logit_from == "smem" and not (
            t.stage_smem and t.row_loop == 1 and t.cluster_n == 1 and t.threads_per_row <= R.WARP
        ):
            self.logit_from = "load"
        self.from_registers = self.logit_from == "registers"
        self.probabilities = R.pick_mode("PROBABILITIES", T.PROBABILITIES, t.n, ("again", "kept"))
        self.onehot = R.pick_mode("ONEHOT", T.ONEHOT, t.n, ("holder", "every"))
        index_load = T.INDEX_LOAD if mX.element_type.width <= 16 else T.INDEX_LOAD_32BIT
        self.staged_index = not self.write_dx and self.logit_from == "smem" and R.pick_mode(
            "INDEX_LOAD", index_load, t.n, ("plain", "staged")) == "staged"  # fmt: skip
        offsets = T.EXP_OFFSET_FUSED if self.write_dx else T.EXP_OFFSET_LSE if self.save_lse else T.EXP_OFFSET
        self.exp_fma = R.pick_mode("EXP_OFFSET", offsets, t.n, ("sub", "fma")) == "fma"
        copy = R.row_tiled_copy(mX.element_type, t)
        # (mW and the totals (sum, mean, 1/kept) are touched only where fold_total is set)
        mSum, mMean, mInvKept = totals or (mLoss, mLoss, mLoss)
        mW = mLoss if mW is None else mW
        kernel = self.kernel(mX, mTarget, mLoss, mLse, mScale, mdX, mW, mSum, mMean, mInvKept, ignore_index, copy)
        R.launch_rows(kernel, t, mX.shape[0], stream, waits=True)

    @cute.kernel
    def kernel(
        self,
        mX: cute.Tensor,
        mTarget: cute.Tensor,
        mLoss: cute.Tensor,
        mLse: cute.Tensor,
        mScale: cute.Tensor,
        mdX: cute.Tensor,
        mW: cute.Tensor,
        mSum: cute.Tensor,
        mMean: cute.Tensor,
        mInvKept: cute.Tensor,
        ignore_index: Int64,
        copy: cute.TiledCopy,
    ):
        t = self.tiling
        tidx, smem, sX, (scratch_a, scratch_b) = R.begin_rows(
            t, mX.element_type, 2 if cutlass.const_expr(self.knobs.online) else 1, 1
        )

        target = cute.make_rmem_tensor(1, Int64)
        x_target = cute.make_rmem_tensor(1, Float32)
        target[0] = Int64(0)
        x_target[0] = Float32(0.0)
        sTarget = None
        if cutlass.const_expr(self.write_dx or self.from_registers):
            # (dlogits need every thread of the row to know its target)
            with_logit = self.write_dx and self.logit_from == "load"
            fetch = functools.partial(load_target, mX, mTarget, t.n, target, x_target, with_logit)
        elif cutlass.const_expr(self.logit_from == "smem"):
            if cutlass.const_expr(self.staged_index):
                sTarget = smem.allocate_tensor(Int64, cute.make_layout(t.rows_per_cta), byte_alignment=16)
                fetch = functools.partial(stage_target_index, mTarget, sTarget)
            else:
                fetch = functools.partial(load_target_index, mTarget, target)
        else:
            fetch = functools.partial(load_target_logit, mX, mTarget, t.n, target, x_target)
        scale = Float32(0.0)
        if cutlass.const_expr(self.write_dx):
            scale = Float32(1.0) if cutlass.const_expr(self.unit_scale) else Float32(mScale[0])
        kept = None
        if cutlass.const_expr(self.fold_total):
            kept = cute.make_rmem_tensor(2, Float32)  # the thread's rows: their losses' sum, their kept count
            kept.fill(0.0)
        row = functools.partial(
            self.row, mLoss, mLse, mdX, sX, sTarget, scale, ignore_index, scratch_a, scratch_b, target, x_target, kept
        )
        # (a staged index joins the row's commit group only if issued before the row's copies)
        R.for_each_row(t, copy, mX, sX, tidx, -Float32.inf, row, while_in_flight=fetch, scalars_first=self.staged_index)
        if cutlass.const_expr(self.fold_total):
            if cutlass.const_expr(self.total_in_cta):
                total = sum_mean_inv(R.block_fold((kept[0], kept[1]), R.add, tidx, t.num_threads))
                if tidx == 0:
                    mSum[0], mMean[0], mInvKept[0] = total
            else:
                write_partial(t, mW, kept, tidx)

    @cute.jit
    def row(
        self, mLoss, mLse, mdX, sX, sTarget, scale: Float32, ignore_index: Int64, scratch_a, scratch_b, target, x_target,
        kept, ctx: R.RowContext, tXrX,
    ):  # fmt: skip
        t = self.tiling
        if cutlass.const_expr(self.staged_index):
            # (the leader's own copy: its wait on the row's group covers it)
            if ctx.row_leader & ctx.row_ok:
                target[0] = sTarget[ctx.tile_row]
        x = tXrX.load().to(Float32)
        ignored = target[0] == ignore_index
        outside = (target[0] < 0) | (target[0] >= t.n)
        holds = ctx.row_leader
        if cutlass.const_expr(self.from_registers):
            col = Int32(cutlass.select_(outside, Int64(-1), target[0]))
            holds, x_target[0] = R.value_at_column(ctx, tXrX, col)
        m, s, e = R.softmax_stats(x, t, self.knobs.online, scratch_a.at(ctx), scratch_b.at(ctx), self.exp_fma)
        if cutlass.const_expr(self.logit_from == "smem"):
            # each lane has waited on its own copies; the warp barrier lets the leader see the
            # others' (the row is this warp's, and nothing refills the buffer: one tile a CTA).
            # Read last, as "load" uses its logit.
            cute.arch.sync_warp()
            if ctx.row_leader & ctx.row_ok:
                at = clamped_column(target[0], t.n)
                x_target[0] = Float32(sX[ctx.tile_row, at])
        if cutlass.const_expr(self.save_lse or self.write_dx):
            lse = m + cute.math.log(s, fastmath=True)
            if cutlass.const_expr(self.save_lse):
                if ctx.row_ok & ctx.row_leader:
                    mLse[ctx.row] = lse
            if cutlass.const_expr(self.write_dx):
                g = cutlass.select_(ignored, Float32(0.0), scale)
                if cutlass.const_expr(self.probabilities == "kept"):
                    k = cute.arch.rcp_approx(s) * g  # (s >= 1: the max contributes exp(0))
                else:
                    e, k = softmax_from_lse(tXrX, lse), g
                write_dlogits(ctx, tXrX, e, k, g, target[0], mdX, self.onehot == "every")
        if ctx.row_ok:
            # one writer a row: the row leader for a loss without a logit, else the holder
            if ignored | outside:
                if ctx.row_leader:
                    loss = cutlass.select_(ignored, Float32(0.0), Float32(float("nan")))
                    mLoss[ctx.row] = loss
                    # (a target outside [0, N) counts as kept: its NaN reaches the total)
                    self.keep(kept, loss, cutlass.select_(ignored, Float32(0.0), Float32(1.0)))
            elif holds:
                # (max - target logit) first: exact when the target is the max, however large
                loss = (m - x_target[0]) + cute.math.log(s, fastmath=True)
                mLoss[ctx.row] = loss
                self.keep(kept, loss, Float32(1.0))

    def keep(self, kept: cute.Tensor | None, loss: Float32, count: Float32) -> None:
        """The row's loss and count added to its writer's running (sum, kept) (`fold_total`)."""
        if cutlass.const_expr(self.fold_total):
            kept[0] = kept[0] + loss
            kept[1] = kept[1] + count


def sum_mean_inv(acc: tuple) -> tuple:
    """The loss's sum, its mean over the kept rows and 1/kept from the folded (sum, kept); kept at
    least 1, so that a batch of ignored rows has a mean of 0, not NaN."""
    total, kept = acc[0], cutlass.max(acc[1], Float32(1.0))
    return total, total / kept, Float32(1.0) / kept


@cute.jit
def write_partial(tiling: cutlass.Constexpr, mW: cute.Tensor, kept: cute.Tensor, tidx: Int32):
    """The CTA's (sum, kept) over its threads, in a fixed order, to its slot of the workspace:
    CTA (x, y) of the grid at x * cluster_n + y. A slot past the workspace is not written: the
    total then folds the rows themselves (cross_entropy_total.PARTS)."""
    acc = R.block_fold((kept[0], kept[1]), R.add, tidx, tiling.num_threads)
    bidx, bidy, _ = cute.arch.block_idx()
    slot = Int64(bidx) * tiling.cluster_n + Int64(bidy)
    if (tidx == 0) & (slot * 2 < cute.size(mW)):
        mW[slot * 2] = acc[0]
        mW[slot * 2 + 1] = acc[1]


@cute.jit
def load_target(
    mX, mTarget, n: cutlass.Constexpr[int], target, x_target, with_logit: cutlass.Constexpr[bool], ctx: R.RowContext
):
    """Every thread's copy of its row's target index, read while the row is in flight; with
    `with_logit`, the row leader's read of the target logit after it (T.TARGET_LOGIT "load")."""
    if ctx.row_ok:
        target[0] = mTarget[ctx.row]
        if cutlass.const_expr(with_logit):
            if ctx.row_leader:
                x_target[0] = Float32(mX[ctx.row, clamped_column(target[0], n)])


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
def stage_target_index(mTarget: cute.Tensor, sTarget: cute.Tensor, ctx: R.RowContext):
    """cp.async of the row's target index into its slot of `sTarget`, by the row leader, before
    the row's own copies (so in their commit group: T.INDEX_LOAD "staged")."""
    if ctx.row_leader & ctx.row_ok:
        atom = R.copy_atom(mTarget.element_type, 1, is_async=True)
        cute.copy(atom, cute.local_tile(mTarget, (1,), (ctx.row,)), cute.local_tile(sTarget, (1,), (ctx.tile_row,)))


@cute.jit
def load_target_logit(mX, mTarget, n: cutlass.Constexpr[int], target, x_target, ctx: R.RowContext):
    """The row leader's two dependent loads (target index, then its logit), issued while the
    row is in flight; an out-of-range target is clamped here and answered with NaN later."""
    if ctx.row_leader & ctx.row_ok:
        target[0] = mTarget[ctx.row]
        x_target[0] = Float32(mX[ctx.row, clamped_column(target[0], n)])


@cute.jit
def softmax_from_lse(tXrX: cute.Tensor, lse: Float32) -> cute.TensorSSA:
    """exp(x - lse) for the thread's slice of its row, in fp32."""
    # (x - lse) first: exact 0 at a row whose one logit dominates
    return cute.math.exp2((tXrX.load().to(Float32) - lse) * R.LOG2_E, fastmath=True)


@cute.jit
def write_dlogits(
    ctx: R.RowContext, tXrX: cute.Tensor, e: cute.TensorSSA, k: Float32, g: Float32, target: Int64, mdX: cute.Tensor,
    every: cutlass.Constexpr[bool],
):  # fmt: skip
    """dx = e * k - onehot(target) * g for the thread's slice of its row, where e * k is its
    softmax probabilities times g (no onehot for a target outside [0, N): its loss is NaN
    already); the onehot by a select at every value, in one FMA with the product (`every`), or in
    the holding thread's branch."""
    tXrG = cute.make_rmem_tensor_like(tXrX, Float32)
    col = Int32(cutlass.select_((target < 0) | (target >= ctx.tiling.n), Int64(-1), target))
    if cutlass.const_expr(every):
        tXrE = cute.make_rmem_tensor_like(tXrX, Float32)
        tXrE.store(e)
        at = col - ctx.tXcX[0][1]  # (each value's column offset from the first is a constant)
        for i in cutlass.range_constexpr(cute.size(tXrG)):
            onehot = cutlass.select_(ctx.tXcX[i][1] - ctx.tXcX[0][1] == at, -g, Float32(0.0))
            tXrG[i] = cute.math.fma(tXrE[i], k, onehot)
    else:
        tXrG.store(e * k)
        holds, _ = R.value_at_column(ctx, tXrX, col)
        if holds:
            for i in cutlass.range_constexpr(cute.size(tXrG)):
                if ctx.tXcX[i][1] == col:
                    tXrG[i] = tXrG[i] - g
    R.store_row(ctx, tXrG.load(), mdX)


launch = CrossEntropy(R.RowKnobs())
