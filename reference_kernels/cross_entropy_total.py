"""The cross-entropy loss and its total in one call: each row's loss (reference_kernels/
cross_entropy.py), then their sum, their mean over the kept rows and 1/kept. A loss asked for no
gradient (an eval loop, `torch.no_grad()`) took the per-row kernel and five small torch ops after
it, each a launch of host time (issue 47). cross_entropy_fused_total is this with dlogits written
too.

Two launches: the row kernel, each CTA of which also folds its rows' losses and kept count into
its partial in the workspace, then one CTA that folds the partials in a fixed order (no atomics:
the same bits every run). The whole-tensor template (total.py) took two launches of its own
after the row kernel, a partials pass over the losses and the fold: each about 6 us of a call's
host time. The workspace is undefined on entry, so a last-CTA finish inside the row kernel would
need a counter zeroed by another launch.

One launch for a small input (T.ONE_CTA: up to 32 KB of logits, 16 rows of 1024 bf16): the row
kernel as one CTA, which writes the total itself. That is where a call's host time is all it
costs (an eval loop's small batch): the second launch was a third of it, and one CTA reads such
an input in less time than a launch takes on the host (H200, N = 1024, M = 8: 6.4 us of host a call
against 9.7; 1.8 us of GPU under a graph against 2.6). The branch on M is compiled into the
launcher (the @cute.jit function's host code, which knows M), not taken in Python.

Kernel contract entry: `launch(mX, mTarget, mLoss, mSum, mMean, mInvKept, mW, ignore_index,
stream)`; mX (M, N), mTarget (M,) int64, mLoss (M,) fp32, mSum, mMean, mInvKept (1,) fp32, mW the
workspace. kept = the rows whose target is not ignore_index, at least 1 (so a batch of ignored
rows has a mean of 0, not NaN). The count is kept in fp32: exact for M <= 2^24.
"""

from __future__ import annotations

import dataclasses

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from reference_kernels import reduce as R
from reference_kernels.cross_entropy import CrossEntropy, sum_mean_inv
from reference_kernels.tuning import cross_entropy as T

OP = "cross_entropy_total"
# The CTAs' partials the workspace holds, (sum, kept) each: M up to 2^18 row tiles. Past that
# (M of 2^18 rows and more at one row a CTA) the finish folds the rows' losses themselves.
PARTS = 1 << 18
WORKSPACE = 2 * PARTS
FINISH_THREADS = 1024


class CrossEntropyTotal(CrossEntropy):
    fold_total = True

    def __init__(
        self, knobs: R.RowKnobs = R.RowKnobs(), parts: int = PARTS, one_cta_limits: tuple[int, int] = T.ONE_CTA
    ) -> None:
        super().__init__(knobs)
        self.parts = parts  # (fewer in a test: the finish's fold of the rows themselves)
        self.one_cta_limits = one_cta_limits  # (threads, bytes of logits) of the one-launch path; (0, 0): none

    def one_cta(self, n: int, width: int) -> tuple[CrossEntropyTotal | None, int]:
        """The one-CTA kernel (`total_in_cta`) and the most rows it takes, at trace time; (None, 0)
        where none applies: a row too long for the bytes, one split over a cluster, or more values a
        thread than its registers hold."""
        threads, most_bytes = self.one_cta_limits
        rows = most_bytes // (n * width // 8) if threads else 0
        if rows < 1 or self.total_in_cta:
            return None, 0
        # (unstaged: the rows' shared memory would grow with the threads; the launch's static block
        # size becomes the kernel's reqntid, which keeps ptxas's registers within one CTA's share)
        knobs = dataclasses.replace(self.knobs, num_threads=threads, stage_smem=False, row_loop=1)
        tiling = R.resolve_tiling(knobs, width, n)
        # (a thread of `threads` has 65536 / threads registers, not 255: fewer values fit without
        # spilling, REGISTER_VALUES' share; the fused kernel at N = 16384 bf16 spilled 296 bytes)
        fits = tiling.values_per_thread * 255 <= R.REGISTER_VALUES * min(255, 65536 // threads)
        if tiling.cluster_n > 1 or not fits:
            return None, 0
        one = type(self)(knobs, self.parts, (0, 0))
        one.total_in_cta = True
        return one, min(rows, tiling.rows_per_cta)

    @cute.jit
    def __call__(
        self,
        mX: cute.Tensor,
        mTarget: cute.Tensor,
        mLoss: cute.Tensor,
        mSum: cute.Tensor,
        mMean: cute.Tensor,
        mInvKept: cute.Tensor,
        mW: cute.Tensor,
        ignore_index: Int64,
        stream,
    ):
        self._launch_total(mX, mTarget, mLoss, mX, mSum, mMean, mInvKept, mW, ignore_index, stream)

    # (the branch on M is compiled into the launcher: no Python value may be carried through it,
    # so each side makes its own kernel)
    @cute.jit
    def _launch_total(self, mX, mTarget, mLoss, mdX, mSum, mMean, mInvKept, mW, ignore_index, stream) -> None:
        # (mdX is written only where write_dx is set: cross_entropy_fused_total)
        if cutlass.const_expr(self.one_cta(mX.shape[1], mX.element_type.width)[1] > 0):
            if mX.shape[0] <= self.one_cta(mX.shape[1], mX.element_type.width)[1]:
                self._launch_one(mX, mTarget, mLoss, mdX, mSum, mMean, mInvKept, mW, ignore_index, stream)
            else:
                self._launch_two(mX, mTarget, mLoss, mdX, mSum, mMean, mInvKept, mW, ignore_index, stream)
        else:
            self._launch_two(mX, mTarget, mLoss, mdX, mSum, mMean, mInvKept, mW, ignore_index, stream)

    def _launch_one(self, mX, mTarget, mLoss, mdX, mSum, mMean, mInvKept, mW, ignore_index, stream) -> None:
        one, _ = self.one_cta(mX.shape[1], mX.element_type.width)
        one._launch(mX, mTarget, mLoss, mLoss, mLoss, mdX, ignore_index, stream, mW, (mSum, mMean, mInvKept))

    def _launch_two(self, mX, mTarget, mLoss, mdX, mSum, mMean, mInvKept, mW, ignore_index, stream) -> None:
        self._launch(mX, mTarget, mLoss, mLoss, mLoss, mdX, ignore_index, stream, mW)
        t = self.tiling
        tiles = cute.ceil_div(cute.ceil_div(Int64(mX.shape[0]), t.rows_per_cta), t.row_loop)
        self.finish(mLoss, mTarget, mSum, mMean, mInvKept, mW, tiles * t.cluster_n, ignore_index).launch(
            grid=[1, 1, 1], block=[FINISH_THREADS, 1, 1], stream=stream, use_pdl=t.dependent_launch
        )

    @cute.kernel
    def finish(
        self,
        mLoss: cute.Tensor,
        mTarget: cute.Tensor,
        mSum: cute.Tensor,
        mMean: cute.Tensor,
        mInvKept: cute.Tensor,
        mW: cute.Tensor,
        parts: Int64,
        ignore_index: Int64,
    ):
        """The partials (or, past PARTS of them, the rows) folded in a fixed order: thread t
        folds items t, t + T, ..., then the CTA folds its threads in order."""
        if cutlass.const_expr(self.tiling.dependent_launch):
            cute.arch.griddepcontrol_wait()
        tidx, _, _ = cute.arch.thread_idx()
        from_parts = parts <= self.parts
        items = cutlass.select_(from_parts, parts, Int64(mLoss.shape[0]))
        acc = cute.make_rmem_tensor(2, Float32)
        acc.fill(0.0)
        for i in cutlass.range(Int32((items + FINISH_THREADS - 1) // FINISH_THREADS), unroll=1):
            j = Int64(i) * FINISH_THREADS + tidx
            if j < items:
                if from_parts:
                    acc[0] = acc[0] + mW[j * 2]
                    acc[1] = acc[1] + mW[j * 2 + 1]
                else:
                    acc[0] = acc[0] + mLoss[j]
                    acc[1] = acc[1] + cutlass.select_(mTarget[j] == ignore_index, Float32(0.0), Float32(1.0))
        total = sum_mean_inv(R.block_fold((acc[0], acc[1]), R.add, tidx, FINISH_THREADS))
        if tidx == 0:
            mSum[0], mMean[0], mInvKept[0] = total


launch = CrossEntropyTotal(R.RowKnobs())
