"""The strided-reduction template: reduce along a middle or leading dim.

The input is viewed as (outer, R, inner): R is the reduced dim, `inner` the product of the
dims after it (contiguous), `outer` the product of those before it. Threads are laid along
`inner`, so every warp load is one coalesced run of a row of the (R, inner) slab; the R
values of a column are split over `threads_r` threads of the CTA, each folding its share in
order with `unroll` loads in flight, then the CTA folds the `threads_r` partials through
shared memory in a fixed order (deterministic: the same bits every run).

Generic over the reduction, as in `reduce.py`: `prologue(x, r)` maps an element (fp32) and
its index along R to a tuple, `combine` merges two tuples, `identity` is the tuple for no
element, and `epilogue(acc)` turns a column's total into its output values. So sum, mean,
max, min, argmax and argmin are the same kernel with another combine. With `rewrite`, each
thread keeps its share of the column in registers and writes `rewrite(x, stats)` back for
every element (a norm over a middle dim: one read, one write; where a share does not fit the
registers, x is read again to be rewritten).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, const_expr

from reference_kernels import reduce as R
from reference_kernels.reduce import (  # noqa: F401 - S.* combines
    count_mean_m2,
    joint,
    max_sumexp,
    pick,
    prod_term,
    scaled,
    scaled_mul,
    unscaled,
    vector_elems,
)
from reference_kernels.reduce import vector_at as _at
from reference_kernels.tuning import strided as T


@dataclass(frozen=True)
class StridedKnobs:
    num_threads: int | None = None  # None: T.NUM_THREADS's, or T.SCALAR_THREADS for scalar loads without rewrite
    threads_r: int | None = None  # None: T.THREADS_R's value (T.THREADS_R_SCALAR's for scalar loads)
    vec_bits: int = 128
    unroll: int = 4  # loads along R in flight per thread (8 ran 5-10% slower on the H100)


@dataclass(frozen=True)
class StridedTiling:
    r: int
    inner: int
    vec: int
    threads_r: int
    num_threads: int
    unroll: int
    # with rewrite: the column share held in registers (x read once), else x read again
    hold: bool = False

    @property
    def threads_inner(self) -> int:
        return self.num_threads // self.threads_r

    @property
    def cols_per_cta(self) -> int:
        return self.threads_inner * self.vec

    @property
    def col_tiles(self) -> int:
        return math.ceil(self.inner / self.cols_per_cta)

    @property
    def per_thread(self) -> int:
        """Indices along R one thread reads."""
        return math.ceil(self.r / self.threads_r)


def resolve_tiling(knobs: StridedKnobs, width_bits: int, r: int, inner: int, rewrite: bool) -> StridedTiling:
    vec = vector_elems(knobs.vec_bits, width_bits, inner)
    # a rewriting thread holds its column share: 1024 of them would not fit the register file
    scalar = vec == 1 and not rewrite
    threads = knobs.num_threads or (T.SCALAR_THREADS if scalar else pick(T.NUM_THREADS, r))
    tr = knobs.threads_r or min(pick(T.THREADS_R_SCALAR if scalar else T.THREADS_R, r), threads // 32)
    if tr & (tr - 1) or threads % (32 * tr) or not 32 <= threads <= 1024:
        raise ValueError(f"threads_r={tr} must be a power of two and num_threads={threads} a multiple of 32*{tr}")
    hold = False
    if rewrite:
        # held in registers where the share fits: more threads along R (a warp still along inner,
        # its loads whole lines), then narrower loads; else x is read again (`hold` False)
        least = 1 if r <= T.NARROW_HOLD_MAX_R else max(1, min(vec, 32 // width_bits))
        h_tr, h_vec = tr, vec
        while knobs.threads_r is None and math.ceil(r / h_tr) * least > T.REGISTER_VALUES and 64 * h_tr <= threads:
            h_tr *= 2
        while h_vec > least and math.ceil(r / h_tr) * h_vec > T.REGISTER_VALUES:
            h_vec //= 2
        if hold := math.ceil(r / h_tr) * h_vec <= T.REGISTER_VALUES:
            tr, vec = h_tr, h_vec
    # narrow columns: fewer threads along inner, more along R, so a CTA is not mostly idle
    while knobs.threads_r is None and tr < 32 and threads // (2 * tr) * vec >= inner * 2 and tr * 2 <= r:
        tr *= 2
    return StridedTiling(r, inner, vec, tr, threads, max(1, min(knobs.unroll, math.ceil(r / tr))), hold)


class StridedReduce:
    """Reduce mX over `dim` (>= 1) with the given combine; outputs are (outer, inner) flat
    (keepdim or not), or mX's shape with `rewrite`."""

    def __init__(
        self,
        dim: int,
        prologue: Callable,
        combine: Callable,
        identity: tuple,
        epilogue: Callable,
        rewrite: Callable | None = None,
        knobs: StridedKnobs = StridedKnobs(),
    ) -> None:
        if dim < 1:
            raise ValueError("the reduced dim must not be the leading (batch) dim")
        self.dim, self.prologue, self.combine, self.identity = dim, prologue, combine, identity
        self.epilogue, self.rewrite, self.knobs = epilogue, rewrite, knobs

    @cute.jit
    def __call__(self, mX: cute.Tensor, outs: tuple, stream):
        shape = mX.shape
        r = const_expr(shape[self.dim])
        inner = const_expr(math.prod(shape[self.dim + 1 :]) if self.dim + 1 < cute.rank(mX) else 1)
        between = const_expr(math.prod(shape[1 : self.dim]) if self.dim > 1 else 1)
        self.tiling = resolve_tiling(self.knobs, mX.element_type.width, r, inner, self.rewrite is not None)
        outer = Int32(shape[0]) * between
        grid = outer * self.tiling.col_tiles
        self.kernel(mX, outs).launch(grid=[grid, 1, 1], block=[self.tiling.num_threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, outs: tuple):
        t = self.tiling
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        o = bidx // t.col_tiles
        ti, tr = tidx % t.threads_inner, tidx // t.threads_inner
        c0 = (bidx % t.col_tiles) * t.cols_per_cta + ti * t.vec
        col_ok = c0 < t.inner
        base = Int64(o) * (t.r * t.inner) + c0
        acc = tuple(tuple(Float32(v) for v in self.identity) for _ in range(t.vec))
        held = []  # with rewrite: the thread's column share, as (row, in bounds, registers)
        # Rows tr, tr + threads_r, ...: batches of `unroll` loads issued before folding.
        batches = const_expr(math.ceil(t.per_thread / t.unroll))
        if const_expr(not t.hold):
            for b in cutlass.range(batches, unroll=1):
                acc = self._fold(self._load(mX, base, b, tr, col_ok, 0, t.r), acc)
        else:
            # a static loop: the registers stay named until they are rewritten
            for b in cutlass.range_constexpr(batches):
                regs = self._load(mX, base, b, tr, col_ok, 0, t.r)
                acc = self._fold(regs, acc)
                held += regs
        acc = self._fold_threads_r(acc, ti, tr)
        if const_expr(self.rewrite is None):
            if col_ok & (tr == 0):
                out_base = Int64(o) * t.inner + c0
                for i in cutlass.range_constexpr(len(outs)):
                    reg = cute.make_rmem_tensor(t.vec, outs[i].element_type)
                    for j in cutlass.range_constexpr(t.vec):
                        reg[j] = outs[i].element_type(self.epilogue(acc[j])[i])
                    cute.autovec_copy(reg, _at(outs[i], out_base, t.vec))
        else:
            stats = [self.epilogue(acc[j]) for j in range(t.vec)]
            if const_expr(t.hold):
                self._rewrite(outs[0], base, held, stats)
            else:
                for b in cutlass.range(batches, unroll=1):
                    self._rewrite(outs[0], base, self._load(mX, base, b, tr, col_ok, 0, t.r), stats)

    @cute.jit
    def _rewrite(self, mO: cute.Tensor, base: Int64, regs: list, stats: list) -> None:
        """`rewrite(x, stats)` of the loads `regs` written to mO where they were in bounds."""
        t = self.tiling
        for rr, ok, reg in regs:
            if ok:
                res = cute.make_rmem_tensor(t.vec, mO.element_type)
                for j in cutlass.range_constexpr(t.vec):
                    res[j] = mO.element_type(self.rewrite(Float32(reg[j]), stats[j]))
                cute.autovec_copy(res, _at(mO, base + Int64(rr) * t.inner, t.vec))

    @cute.jit
    def _load(self, mX: cute.Tensor, base: Int64, b, tr: Int32, col_ok, first, end) -> list:
        """Batch `b` of the thread's rows among [first, end): `unroll` loads issued together,
        each with whether it was in bounds."""
        t = self.tiling
        regs = []
        for u in cutlass.range_constexpr(t.unroll):
            rr = first + (b * t.unroll + u) * t.threads_r + tr
            ok = col_ok & (rr < end)
            reg = cute.make_rmem_tensor(t.vec, mX.element_type)
            if ok:
                cute.autovec_copy(_at(mX, base + Int64(rr) * t.inner, t.vec), reg)
            regs.append((rr, ok, reg))
        return regs

    @cute.jit
    def _fold(self, regs: list, acc: tuple) -> tuple:
        t = self.tiling
        if const_expr(getattr(self.combine, "block", None) is not None):
            return tuple(
                R.fold_terms(self.combine, acc[j], [(ok, self.prologue(Float32(reg[j]), rr)) for rr, ok, reg in regs])
                for j in range(t.vec)
            )
        # Element-wise merges load by load, every column of a load together: taken column by column,
        # a sum of a GELU over the batch dim ran at 87-90% of copy, not 99.6.
        for rr, ok, reg in regs:
            acc = tuple(
                R.fold_terms(self.combine, acc[j], [(ok, self.prologue(Float32(reg[j]), rr))]) for j in range(t.vec)
            )
        return acc

    @cute.jit
    def _fold_threads_r(self, acc: tuple, ti: Int32, tr: Int32) -> tuple:
        """The `threads_r` partials of each column folded through shared memory in a fixed
        order (the same bits every run), in every thread of the column."""
        t = self.tiling
        if const_expr(t.threads_r > 1):
            arity = const_expr(len(self.identity))
            smem = cutlass.memory.SmemAllocator()
            s = smem.allocate_tensor(
                Float32, cute.make_ordered_layout((t.threads_r, t.threads_inner * t.vec, arity), order=(1, 0, 2)), 16
            )
            for j in cutlass.range_constexpr(t.vec):
                for k in cutlass.range_constexpr(arity):
                    s[tr, ti * t.vec + j, k] = acc[j][k]
            cute.arch.barrier()
            if const_expr(arity == 1):  # (one value a partial: unrolled, its loads are few)
                totals = []
                for j in cutlass.range_constexpr(t.vec):
                    total = (s[0, ti * t.vec + j, 0],)
                    for q in cutlass.range_constexpr(1, t.threads_r):
                        total = self.combine(total, (s[q, ti * t.vec + j, 0],))
                    totals.append(total)
                acc = tuple(totals)
            else:
                # partials q = 1, 2, ... in a loop, every column of a partial together: unrolled,
                # ptxas hoists every partial's loads (an argmax over 32 threads along R took 254
                # registers, 51 at threads_r=1); column by column, each merge waits on its load
                acc = tuple(tuple(s[0, ti * t.vec + j, k] for k in range(arity)) for j in range(t.vec))
                for q in cutlass.range(1, t.threads_r, unroll=1):
                    acc = tuple(
                        self.combine(acc[j], tuple(s[q, ti * t.vec + j, k] for k in range(arity))) for j in range(t.vec)
                    )
        return acc


# --------------------------------------------------------------------------- combines


INF = float("inf")


def first(x: Float32, r: Int32) -> tuple:
    return (x,)


def with_index(x: Float32, r: Int32) -> tuple:
    return (x, Float32(r))


def add(a: tuple, b: tuple) -> tuple:
    return tuple(x + y for x, y in zip(a, b))


def mul(a: tuple, b: tuple) -> tuple:
    return tuple(x * y for x, y in zip(a, b))


def fmax(a: tuple, b: tuple) -> tuple:
    return (cute.arch.fmax(a[0], b[0]),)


def fmin(a: tuple, b: tuple) -> tuple:
    return (cute.arch.fmin(a[0], b[0]),)


def argmax(a: tuple, b: tuple) -> tuple:
    """(value, index): the larger value, the first index among equals (torch's choice)."""
    take_b = (b[0] > a[0]) | ((b[0] == a[0]) & (b[1] < a[1]))
    return (cutlass.select_(take_b, b[0], a[0]), cutlass.select_(take_b, b[1], a[1]))


def argmin(a: tuple, b: tuple) -> tuple:
    take_b = (b[0] < a[0]) | ((b[0] == a[0]) & (b[1] < a[1]))
    return (cutlass.select_(take_b, b[0], a[0]), cutlass.select_(take_b, b[1], a[1]))


def _extreme_block(pick: Callable, fill: float) -> Callable:
    """A block merge of (value, index) terms in increasing index order: the extreme value, then
    the first index holding it. An empty block (or one of NaNs alone, which the element-wise
    merge never takes either) has index +inf, so that it never wins a merge."""

    def block(terms: list) -> tuple:
        xs = [R.masked(ok, t[0], fill) for ok, t in terms]
        m = xs[0]
        for x in xs[1:]:
            m = pick(m, x)
        idx = Float32(INF)
        for (ok, t), x in reversed(list(zip(terms, xs))):
            hit = x == m if ok is True else ok & (x == m)
            idx = cutlass.select_(hit, t[1], idx)
        return (m, idx)

    return block


argmax.block = _extreme_block(cute.arch.fmax, -math.inf)
argmin.block = _extreme_block(cute.arch.fmin, math.inf)
