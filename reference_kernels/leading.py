"""The leading-dim reduction template: reduce over dim 0 (the batch dim), whose length R is known
only at run time, with R split over CTAs where the columns alone are too few to fill the GPU.

The input is viewed as (R, inner). CTA (s, c) folds rows [s * chunk, (s + 1) * chunk) of column
tile c as the strided template folds a column (threads along inner, `threads_r` of them along
R, `unroll` loads in flight; strided.py), and writes a partial per column to the workspace. A
second launch folds each column's `splits` partials in order and writes the epilogue's values:
the same bits every run (no atomics). With `rewrite`, the second launch keeps the statistics in
the workspace and a third, on the first's grid, rewrites every element with its column's (two
reads and a write: R values of a column do not stay on chip across CTAs).

The epilogue is given R (a mean divides by it, a variance by R less its correction): the kernel
is compiled once for every batch size.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, const_expr

from reference_kernels.reduce import pick, vector_elems
from reference_kernels.reduce import vector_at as _at
from reference_kernels.strided import StridedKnobs, StridedReduce, StridedTiling
from reference_kernels.tuning import strided as T

MAX_ARITY = 4  # values a partial or a column's statistics hold


def workspace_elems(inner: int, arity: int) -> int:
    """fp32 scratch a problem with `inner` columns takes: each column's statistics, then up to
    T.LEADING_MAX_SPLITS partials a column (fewer where that would pass T.LEADING_MAX_WORKSPACE; ValueError
    where not even one fits)."""
    need = inner * (MAX_ARITY + arity)
    if need > T.LEADING_MAX_WORKSPACE:
        raise ValueError(
            f"{inner} columns: their statistics and partials take {need} fp32, over {T.LEADING_MAX_WORKSPACE}"
        )
    return min(need + (T.LEADING_MAX_SPLITS - 1) * inner * arity, T.LEADING_MAX_WORKSPACE)


@dataclass(frozen=True)
class LeadingKnobs(StridedKnobs):
    splits: int | None = None  # CTAs along R; None: enough for T.LEADING_TARGET_CTAS


@dataclass(frozen=True)
class LeadingTiling(StridedTiling):
    """The strided template's tiling with R (r = 0) known only at run time, split over `splits`
    CTAs."""

    splits: int = 1


def resolve_tiling(knobs: LeadingKnobs, width_bits: int, inner: int, arity: int, workspace: int) -> LeadingTiling:
    vec = vector_elems(knobs.vec_bits, width_bits, inner)
    threads = knobs.num_threads or (T.SCALAR_THREADS if vec == 1 else T.LEADING_NUM_THREADS)
    tr = knobs.threads_r or 1
    max_tr = pick(T.LEADING_MAX_THREADS_R, arity)
    # narrow columns: R over more of the CTA's threads, so that there are more CTAs
    while knobs.threads_r is None and tr < max_tr and math.ceil(inner / (threads // tr * vec)) < T.LEADING_TARGET_CTAS:
        tr *= 2
    # (a warp may span rows here: each of its rows is still a whole run of 8 x 16 bytes)
    if tr & (tr - 1) or threads % tr or threads % 32 or not 32 <= threads <= 1024:
        raise ValueError(f"threads_r={tr} must be a power of two and num_threads={threads} a multiple of 32 and of it")
    col_tiles = math.ceil(inner / (threads // tr * vec))
    fits = (workspace - inner * MAX_ARITY) // (inner * arity)
    splits = knobs.splits or max(1, min(T.LEADING_MAX_SPLITS, math.ceil(T.LEADING_TARGET_CTAS / col_tiles)))
    if not 1 <= splits <= fits:
        raise ValueError(f"splits={splits}: the workspace holds {fits} partials a column")
    return LeadingTiling(0, inner, vec, tr, threads, max(1, knobs.unroll), splits=splits)


class LeadingReduce(StridedReduce):
    """Reduce mX (R, ...) over dim 0 (or its first `span` dims) with the given combine; `epilogue(acc, r)` turns a column's
    total and R into its output values; outputs are flat over the other dims (keepdim or not),
    or, with `rewrite(x, stats)`, mX's shape (`stats`: how many of the epilogue's values the
    rewrite reads). mW: fp32 scratch of `workspace_elems(inner, arity)`."""

    def __init__(
        self,
        prologue: Callable,
        combine: Callable,
        identity: tuple,
        epilogue: Callable,
        rewrite: Callable | None = None,
        knobs: LeadingKnobs = LeadingKnobs(),
        span: int = 1,
        stats: int = 1,
    ) -> None:
        if not 1 <= len(identity) <= MAX_ARITY or not 1 <= stats <= MAX_ARITY:
            raise ValueError(f"the reduced tuple and the statistics hold 1..{MAX_ARITY} values")
        self.dim, self.prologue, self.combine, self.identity = 0, prologue, combine, identity
        self.epilogue, self.rewrite, self.knobs, self.stats = epilogue, rewrite, knobs, stats
        self.span = span  # leading dims reduced together (one run of memory)

    @cute.jit
    def __call__(self, mX: cute.Tensor, outs: tuple, mW: cute.Tensor, stream):
        inner = const_expr(math.prod(mX.shape[self.span :]) if self.span < cute.rank(mX) else 1)
        arity = const_expr(len(self.identity))
        self.tiling = resolve_tiling(self.knobs, mX.element_type.width, inner, arity, cute.size(mW.shape))
        t = self.tiling
        r = Int32(mX.shape[0]) * const_expr(math.prod(mX.shape[1 : self.span]) if self.span > 1 else 1)
        chunk = (r + t.splits - 1) // t.splits
        self.partials(mX, mW, r, chunk).launch(
            grid=[t.col_tiles * t.splits, 1, 1], block=[t.num_threads, 1, 1], stream=stream
        )
        cols = (inner + T.LEADING_FINAL_THREADS - 1) // T.LEADING_FINAL_THREADS
        self.final(outs, mW, r).launch(grid=[cols, 1, 1], block=[T.LEADING_FINAL_THREADS, 1, 1], stream=stream)
        if const_expr(self.rewrite is not None):
            self.rewrite_all(mX, outs[0], mW, r, chunk).launch(
                grid=[t.col_tiles * t.splits, 1, 1], block=[t.num_threads, 1, 1], stream=stream
            )

    @cute.jit
    def _place(self, r: Int32, chunk: Int32) -> tuple:
        """This thread's place: its CTA's split along R, its column and row offsets in the CTA,
        its first column, whether that is inside the tensor, and its split's rows [first, end)."""
        t = self.tiling
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        split = bidx // t.col_tiles
        ti, tr = tidx % t.threads_inner, tidx // t.threads_inner
        c0 = (bidx % t.col_tiles) * t.cols_per_cta + ti * t.vec
        first = split * chunk
        end = first + chunk
        return split, ti, tr, c0, c0 < t.inner, first, cutlass.select_(end < r, end, r)

    @cute.kernel
    def partials(self, mX: cute.Tensor, mW: cute.Tensor, r: Int32, chunk: Int32):
        t = self.tiling
        arity = const_expr(len(self.identity))
        split, ti, tr, c0, col_ok, first, end = self._place(r, chunk)
        acc = tuple(tuple(Float32(v) for v in self.identity) for _ in range(t.vec))
        step = t.unroll * t.threads_r
        for b in cutlass.range((chunk + step - 1) // step, unroll=1):
            acc = self._fold(self._load(mX, Int64(c0), b, tr, col_ok, first, end), acc)
        acc = self._fold_threads_r(acc, ti, tr)
        if col_ok & (tr == 0):
            at = t.inner * MAX_ARITY + (Int64(split) * t.inner + c0) * arity
            for j in cutlass.range_constexpr(t.vec):
                for k in cutlass.range_constexpr(arity):
                    mW[at + j * arity + k] = acc[j][k]

    @cute.kernel
    def final(self, outs: tuple, mW: cute.Tensor, r: Int32):
        t = self.tiling
        arity = const_expr(len(self.identity))
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        col = bidx * T.LEADING_FINAL_THREADS + tidx
        if col < t.inner:
            acc = tuple(Float32(v) for v in self.identity)
            for s in cutlass.range(t.splits, unroll=1):
                at = t.inner * MAX_ARITY + (s * t.inner + col) * arity
                acc = self.combine(acc, tuple(mW[at + k] for k in range(arity)))
            res = self.epilogue(acc, Float32(r))
            if const_expr(self.rewrite is None):
                for i in cutlass.range_constexpr(len(outs)):
                    _at(outs[i], Int64(col), 1)[0] = outs[i].element_type(res[i])
            else:
                for k in cutlass.range_constexpr(self.stats):
                    mW[col * MAX_ARITY + k] = Float32(res[k])

    @cute.kernel
    def rewrite_all(self, mX: cute.Tensor, mO: cute.Tensor, mW: cute.Tensor, r: Int32, chunk: Int32):
        """Every element rewritten with its column's statistics, on the partials' grid: a thread
        reads its columns' statistics once, then walks its rows as it folded them."""
        t = self.tiling
        _, _, tr, c0, col_ok, first, end = self._place(r, chunk)
        at = cutlass.select_(col_ok, c0, 0)  # (a column past the last reads the first's)
        stats = [tuple(mW[(at + j) * MAX_ARITY + k] for k in range(self.stats)) for j in range(t.vec)]
        step = t.unroll * t.threads_r
        for b in cutlass.range((chunk + step - 1) // step, unroll=1):
            for rr, ok, reg in self._load(mX, Int64(c0), b, tr, col_ok, first, end):
                if ok:
                    o = cute.make_rmem_tensor(t.vec, mO.element_type)
                    for j in cutlass.range_constexpr(t.vec):
                        o[j] = mO.element_type(self.rewrite(Float32(reg[j]), stats[j]))
                    cute.autovec_copy(o, _at(mO, Int64(rr) * t.inner + c0, t.vec))
