"""The column-scan template: a cumulative combine along a dim other than the last, in one pass
over memory.

The tensor is viewed as (outer, L, inner): L is the scanned dim, `inner` the product of the dims
after it (contiguous), `outer` of those before it. Each column of the (L, inner) slab is scanned.
Threads lie along `inner` (a warp's load is whole 128-byte lines of a few rows) and `threads_r`
of them along L: one CTA walks a tile of columns down L a chunk at a time, a chunk being
`threads_r * per_thread` rows, thread tr holding the contiguous rows
[tr * per_thread, (tr + 1) * per_thread) of it in registers, a vector of columns a row:

    registers (a thread's rows, in order)  ->  the threads_r run totals of a column, scanned
        through shared memory in log2(threads_r) steps  ->  a carry of the earlier chunks

The next chunk's loads are issued before the current one is scanned. threads_r > 1 gives a
tensor of few columns more CTAs. Where the columns still make too few, the batch dim is cut into
`splits` segments on CTAs of their own: a first launch writes each segment's column totals to
the workspace, the second scans each segment from the earlier ones' totals, folded in order (x
read twice; a decoupled look-back would read it once). A middle dim is walked whole: its batch
makes the CTAs. The tables: tuning/scan.py's COLUMN_*.

Generic over the scan as scan.py's RowScan is (its combines, prologue, reverse, exclusive);
every input has the output's shape.
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
from reference_kernels.tuning import scan as T

WARP = 32


@dataclass(frozen=True)
class ColumnScanKnobs:
    num_threads: int | None = None  # None: T.COLUMN_NUM_THREADS's
    threads_r: int | None = None  # threads along L; None: resolve_tiling's rules
    per_thread: int | None = None  # rows a thread holds a chunk; None: T.COLUMN_PER_THREAD's
    vec_bits: int = 128
    prefetch: bool = True  # load chunk c+1 while chunk c is scanned
    splits: int | None = None  # the batch dim's segments (CTAs along it); None: resolve_tiling's rules


@dataclass(frozen=True)
class ColumnScanTiling:
    inner: int
    vec: int
    threads_inner: int
    threads_r: int
    per_thread: int
    prefetch: bool
    splits: int = 1

    @property
    def num_threads(self) -> int:
        return self.threads_inner * self.threads_r

    @property
    def cols_per_cta(self) -> int:
        return self.threads_inner * self.vec

    @property
    def col_tiles(self) -> int:
        return math.ceil(self.inner / self.cols_per_cta)

    @property
    def chunk(self) -> int:
        return self.threads_r * self.per_thread


def workspace_elems(inner: int) -> int:
    """fp32 scratch a scan along the batch dim of `inner` columns asks for: each segment's column
    totals, for up to T.COLUMN_MAX_SPLITS segments (0 where not two fit the contract's limit)."""
    fits = min(T.COLUMN_MAX_SPLITS, T.COLUMN_MAX_WORKSPACE // inner)
    return fits * inner if fits >= 2 else 0


def resolve_tiling(
    knobs: ColumnScanKnobs,
    widest_bits: int,
    inner: int,
    length: int | None,
    outer: int = 1,
    combine: str = "add",
    workspace: int = 0,
) -> ColumnScanTiling:
    """`length`: L, known at compile time for a middle dim (None for the batch dim: known at run
    time); `outer`: the slabs known at compile time (the dims between the batch and L; a batch
    is counted as one, so a middle dim of a large batch may have more CTAs than it needs);
    `workspace`: the fp32 elements the batch dim's segments may use."""
    threads = knobs.num_threads or pick(T.COLUMN_NUM_THREADS, widest_bits)
    if threads % WARP or not WARP <= threads <= 1024:
        raise ValueError(f"num_threads={threads} must be a multiple of 32, <= 1024")
    vec = vector_elems(knobs.vec_bits, widest_bits, inner)
    lae = combine == "log_add_exp"
    per_thread = knobs.per_thread or pick(T.COLUMN_LOG_ADD_EXP_PER_THREAD if lae else T.COLUMN_PER_THREAD, widest_bits)
    max_tr = T.COLUMN_LOG_ADD_EXP_MAX_THREADS_R if lae else T.COLUMN_MAX_THREADS_R
    lanes = 1 << max(0, math.ceil(inner / vec) - 1).bit_length()  # vectors a row, to a power of two
    tr = knobs.threads_r or max(1, threads // lanes)
    if knobs.threads_r is None:
        # few columns: L over more threads (a warp's row still 8 vectors: whole 128-byte lines)
        while (
            tr < max_tr
            and threads // tr > 8
            and outer * math.ceil(inner / (threads // tr * vec)) < T.COLUMN_TARGET_CTAS
        ):
            tr *= 2
        tr = min(tr, max_tr)
        # a short middle dim: its batch makes the CTAs; threads along it only where they walk it
        while length is not None and tr > 1 and tr * per_thread * T.COLUMN_MIN_CHUNKS > length:
            tr //= 2
        tr = max(tr, WARP // min(lanes, WARP))  # (a warp's lanes past the columns: along L)
    # a CTA no wider than the columns
    while threads > max(WARP, tr) and (threads // tr // 2) * vec >= inner:
        threads //= 2
    if tr & (tr - 1) or threads % tr or threads % WARP:
        raise ValueError(f"threads_r={tr} must be a power of two dividing num_threads={threads} in whole warps")
    # few columns along the batch dim: segments of it on CTAs of their own, each scanned after the
    # earlier segments' totals are known (x read twice: worth it only where the columns' CTAs are
    # too few to keep the loads in flight)
    tiles = math.ceil(inner / (threads // tr * vec))
    fits = workspace // inner if length is None else 0
    auto = min(fits, math.ceil(T.COLUMN_SPLIT_TARGET_CTAS / tiles)) if tiles < T.COLUMN_SPLIT_BELOW_CTAS else 1
    splits = knobs.splits or max(1, auto)
    if splits < 1 or splits > 1 and splits > fits:
        raise ValueError(f"splits={splits}: the workspace holds the totals of {fits} segments")
    return ColumnScanTiling(inner, vec, threads // tr, tr, per_thread, knobs.prefetch, splits)


class ColumnScan:
    """outs[0] = the scan of prologue(ins) along `dim` (not the last; 0 is the batch dim, its
    length known at run time)."""

    def __init__(
        self,
        dim: int,
        prologue: Callable,
        combine: Callable,
        identity: float,
        reverse: bool = False,
        exclusive: bool = False,
        knobs: ColumnScanKnobs = ColumnScanKnobs(),
    ) -> None:
        self.dim, self.prologue, self.combine, self.identity = dim, prologue, combine, identity
        self.reverse, self.exclusive, self.knobs = reverse, exclusive, knobs

    @cute.jit
    def __call__(self, ins: tuple, outs: tuple, stream, mW: cute.Tensor | None = None):
        """mW: the batch dim's scratch, fp32 of `workspace_elems(inner)` (None: one segment)."""
        mO = outs[0]
        shape = mO.shape
        if const_expr(self.dim >= cute.rank(mO) - 1):
            raise ValueError(f"dim {self.dim} is the last of a rank-{cute.rank(mO)} tensor: scan.RowScan scans it")
        inner = const_expr(math.prod(shape[self.dim + 1 :]))
        widest = const_expr(max(t.element_type.width for t in (*ins, *outs)))
        between = const_expr(math.prod(shape[1 : self.dim]) if self.dim > 1 else 1)
        if const_expr(self.dim == 0):
            length, outer, static_length = Int32(shape[0]), Int32(1), None
        else:
            length, outer, static_length = Int32(shape[self.dim]), Int32(shape[0]) * between, shape[self.dim]
        ws = const_expr(0 if mW is None else cute.size(mW.shape))
        self.tiling = resolve_tiling(self.knobs, widest, inner, static_length, between, self.combine.__name__, ws)
        t = self.tiling
        grid, block = [outer * t.col_tiles * t.splits, 1, 1], [t.num_threads, 1, 1]
        seg = (length + t.chunk * t.splits - 1) // (t.chunk * t.splits)  # chunks a segment
        if const_expr(t.splits > 1):
            self.kernel(ins, outs, mW, length, seg, False).launch(grid=grid, block=block, stream=stream)
        self.kernel(ins, outs, mW, length, seg, True).launch(grid=grid, block=block, stream=stream)

    @cute.kernel
    def kernel(self, ins: tuple, outs: tuple, mW, length: Int32, seg: Int32, write: cutlass.Constexpr[bool]):
        """Segment `bidx // col_tiles` of its columns: with `write`, scanned from the earlier
        segments' totals in mW (none where there is one segment); else its totals written there."""
        t = self.tiling
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        # (segments are the batch dim's: one slab, split along it)
        split, o = (bidx // t.col_tiles, 0) if const_expr(t.splits > 1) else (0, bidx // t.col_tiles)
        tile = bidx % t.col_tiles
        ti, tr = tidx % t.threads_inner, tidx // t.threads_inner
        c0 = tile * t.cols_per_cta + ti * t.vec
        col_ok = c0 < t.inner
        base = Int64(o) * length * t.inner + c0
        first = split * seg  # the segment's chunks [first, first + seg), rows up to `limit`
        limit = cutlass.min((first + seg) * t.chunk, length)
        sT = None
        if const_expr(t.threads_r > 1):
            # the threads' run totals, scanned along L in steps that read one buffer and write the
            # other; a pair of them for each chunk parity, so that a thread may write chunk c+1's
            # while a slower one still reads chunk c's (as RowScan's warp totals)
            smem = cutlass.memory.SmemAllocator()
            sT = smem.allocate_tensor(
                Float32, cute.make_ordered_layout((t.threads_r, t.cols_per_cta, 2, 2), order=(1, 0, 2, 3)), 16
            )
        carry = tuple(Float32(self.identity) for _ in range(t.vec))
        if const_expr(t.splits > 1 and write):
            # the earlier segments' totals, folded in order (the same bits every run)
            at = cutlass.select_(col_ok, c0, 0)
            for q in cutlass.range(split, unroll=1):
                carry = tuple(self.combine(carry[j], mW[Int64(q) * t.inner + at + j]) for j in range(t.vec))
        span = (length, limit)
        # two register buffers made before the loop (one made inside it is one storage)
        bufA = self._alloc(ins)
        bufB = self._alloc(ins)
        if const_expr(t.prefetch):
            self._load(ins, base, span, first, tr, col_ok, bufA)
            for p in cutlass.range((seg + 1) // 2, unroll=1):
                c = first + 2 * p
                self._load(ins, base, span, c + 1, tr, col_ok, bufB)
                carry = self._chunk(bufA, outs, base, span, c, ti, tr, col_ok, sT, carry, write)
                self._load(ins, base, span, c + 2, tr, col_ok, bufA)
                carry = self._chunk(bufB, outs, base, span, c + 1, ti, tr, col_ok, sT, carry, write)
        else:
            for p in cutlass.range(seg, unroll=1):
                self._load(ins, base, span, first + p, tr, col_ok, bufA)
                carry = self._chunk(bufA, outs, base, span, first + p, ti, tr, col_ok, sT, carry, write)
        if const_expr(not write):
            if col_ok & (tr == 0):
                for j in cutlass.range_constexpr(t.vec):
                    mW[Int64(split) * t.inner + c0 + j] = carry[j]

    def _alloc(self, ins: tuple) -> tuple:
        t = self.tiling
        return tuple(cute.make_rmem_tensor(t.per_thread * t.vec, x.element_type) for x in ins)

    @cute.jit
    def _row(self, span: tuple, c: Int32, tr: Int32, k: int) -> tuple:
        """Row k of thread tr's run in chunk c: its place in scan order, in memory, and whether
        it is in the segment (span: L, and the segment's end in scan order)."""
        t = self.tiling
        length, limit = span
        logical = c * t.chunk + tr * t.per_thread + k
        return (logical < limit), ((length - 1 - logical) if const_expr(self.reverse) else logical)

    @cute.jit
    def _load(self, ins: tuple, base: Int64, span: tuple, c: Int32, tr: Int32, col_ok, regs: tuple):
        """The thread's rows of chunk c of every input into `regs` (past the segment: left as is;
        the scan reads the identity there)."""
        t = self.tiling
        for i in cutlass.range_constexpr(len(ins)):
            for k in cutlass.range_constexpr(t.per_thread):
                inside, row = self._row(span, c, tr, k)
                if col_ok & inside:
                    vreg = cute.make_rmem_tensor(t.vec, ins[i].element_type)
                    cute.autovec_copy(_at(ins[i], base + Int64(row) * t.inner, t.vec), vreg)
                    for j in cutlass.range_constexpr(t.vec):
                        regs[i][k * t.vec + j] = vreg[j]

    @cute.jit
    def _values(self, regs: tuple, span: tuple, c: Int32, tr: Int32, k: int) -> list:
        """The scanned values of the thread's row k (the identity past the segment)."""
        t = self.tiling
        inside, _ = self._row(span, c, tr, k)
        v = [self.prologue(tuple(r[k * t.vec + j] for r in regs)) for j in range(t.vec)]
        return [cutlass.select_(inside, Float32(x), Float32(self.identity)) for x in v]

    @cute.jit
    def _chunk(
        self,
        regs: tuple,
        outs: tuple,
        base: Int64,
        span: tuple,
        c: Int32,
        ti: Int32,
        tr: Int32,
        col_ok,
        sT: cute.Tensor,
        carry: tuple,
        write: bool = True,
    ) -> tuple:
        """Chunk c scanned from `carry` (with `write`, its outputs written); returns the carry
        past it."""
        t = self.tiling
        ident = Float32(self.identity)
        totals = self._values(regs, span, c, tr, 0)
        for k in cutlass.range_constexpr(1, t.per_thread):
            v = self._values(regs, span, c, tr, k)
            totals = [self.combine(totals[j], v[j]) for j in range(t.vec)]
        before = [ident for _ in range(t.vec)]
        running = totals  # (the chunk's total of the column)
        if const_expr(t.threads_r > 1):
            # the column's threads_r run totals scanned along L (Hillis-Steele): log2(threads_r)
            # combines a thread where folding all of them took threads_r
            parity = c % 2
            col = ti * t.vec
            steps = const_expr((t.threads_r - 1).bit_length())
            incl = totals
            for j in cutlass.range_constexpr(t.vec):
                sT[tr, col + j, 0, parity] = incl[j]
            for i in cutlass.range_constexpr(steps):
                cute.arch.barrier()
                has = tr >= (1 << i)
                q = cutlass.select_(has, tr - (1 << i), 0)
                incl = [
                    cutlass.select_(has, self.combine(sT[q, col + j, i % 2, parity], incl[j]), incl[j])
                    for j in range(t.vec)
                ]
                for j in cutlass.range_constexpr(t.vec):
                    sT[tr, col + j, (i + 1) % 2, parity] = incl[j]
            cute.arch.barrier()
            prev = cutlass.select_(tr > 0, tr - 1, 0)
            before = [cutlass.select_(tr > 0, sT[prev, col + j, steps % 2, parity], ident) for j in range(t.vec)]
            running = [sT[t.threads_r - 1, col + j, steps % 2, parity] for j in range(t.vec)]
        if const_expr(not write):
            return tuple(self.combine(carry[j], running[j]) for j in range(t.vec))
        acc = [self.combine(carry[j], before[j]) for j in range(t.vec)]
        for k in cutlass.range_constexpr(t.per_thread):
            inside, row = self._row(span, c, tr, k)
            # (the values again from the loads, not held from the totals' pass: held in fp32 they
            # doubled a bf16 chunk's registers)
            v = self._values(regs, span, c, tr, k)
            res = cute.make_rmem_tensor(t.vec, outs[0].element_type)
            for j in cutlass.range_constexpr(t.vec):
                if const_expr(self.exclusive):
                    res[j] = outs[0].element_type(acc[j])
                    acc[j] = self.combine(acc[j], v[j])
                else:
                    acc[j] = self.combine(acc[j], v[j])
                    res[j] = outs[0].element_type(acc[j])
            if col_ok & inside:
                cute.autovec_copy(res, _at(outs[0], base + Int64(row) * t.inner, t.vec))
        return tuple(self.combine(carry[j], running[j]) for j in range(t.vec))
