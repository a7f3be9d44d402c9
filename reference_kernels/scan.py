"""The scan template: a cumulative combine along the last dim, in one pass over memory.

One CTA scans one row, chunk by chunk: a chunk is `num_threads * per_thread` elements,
thread t holding the contiguous run [t*per_thread, (t+1)*per_thread) of it in registers
(loaded as 128-bit vectors). Within a chunk the scan climbs three levels:

    registers (a thread's run, in order)  ->  warp (shuffle-up scan of run totals)
        ->  block (each warp's total through shared memory)

and a carry (the combine of all earlier chunks) enters each chunk's prefix. The next
chunk's loads are issued before the current one is scanned, so a row streams through the
CTA; many rows per SM keep HBM busy. Rows are independent: a long row is one CTA's work,
which suits KernelBench's many-row scans (a single-row scan of a huge tensor would want a
decoupled look-back across CTAs instead).

Generic over the scan: `prologue(values)` maps the inputs' elements (fp32, and a mask's as
Boolean) to the scanned value, `combine` is associative with `identity`; `reverse` scans
from the end of the row (cumsum of a flip, flipped back), `exclusive` writes the combine of
the elements strictly before each one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, const_expr

from reference_kernels.reduce import LOG2_E, pick, vector_elems
from reference_kernels.reduce import vector_at as _at
from reference_kernels.tuning import scan as T

WARP = 32


@dataclass(frozen=True)
class ScanKnobs:
    num_threads: int = 256
    per_thread: int | None = None  # elements a thread holds per chunk; None: tuning.scan's, by the combine
    vec_bits: int = 128
    prefetch: bool = True  # load chunk c+1 while chunk c is scanned


@dataclass(frozen=True)
class ScanTiling:
    n: int
    vec: int
    num_threads: int
    per_thread: int
    prefetch: bool

    @property
    def chunk(self) -> int:
        return self.num_threads * self.per_thread

    @property
    def chunks(self) -> int:
        return math.ceil(self.n / self.chunk)

    @property
    def warps(self) -> int:
        return self.num_threads // WARP


def resolve_tiling(knobs: ScanKnobs, widest_bits: int, n: int, combine: str = "add") -> ScanTiling:
    if knobs.num_threads % WARP or not WARP <= knobs.num_threads <= 1024:
        raise ValueError(f"num_threads={knobs.num_threads} must be a multiple of 32, <= 1024")
    table = T.LOG_ADD_EXP_PER_THREAD if combine == "log_add_exp" else T.PER_THREAD
    per_thread = pick(table, widest_bits) if knobs.per_thread is None else knobs.per_thread
    vec = math.gcd(vector_elems(knobs.vec_bits, widest_bits, n), per_thread)
    threads = knobs.num_threads
    # a short row: fewer elements a thread, then fewer threads, so most of them hold some
    while per_thread > vec and threads * per_thread >= 2 * n:
        per_thread //= 2
    while threads > WARP and threads * per_thread >= 2 * n:
        threads //= 2
    if per_thread % vec:
        raise ValueError(f"per_thread={per_thread} must be a multiple of the vector ({vec})")
    return ScanTiling(n, vec, threads, per_thread, knobs.prefetch)


class RowScan:
    """outs[0][m, :] = scan of prologue(ins[*][m, :]) along the row."""

    def __init__(
        self,
        prologue: Callable,
        combine: Callable,
        identity: float,
        reverse: bool = False,
        exclusive: bool = False,
        knobs: ScanKnobs = ScanKnobs(),
    ) -> None:
        self.prologue, self.combine, self.identity = prologue, combine, identity
        self.reverse, self.exclusive, self.knobs = reverse, exclusive, knobs

    @cute.jit
    def __call__(self, ins: tuple, outs: tuple, stream):
        mO = outs[0]
        n = const_expr(mO.shape[cute.rank(mO) - 1])
        widest = const_expr(max(t.element_type.width for t in (*ins, *outs)))
        self.tiling = resolve_tiling(self.knobs, widest, n, self.combine.__name__)
        rows = Int32(mO.shape[0]) * const_expr(math.prod(mO.shape[1:]) // n)
        self.kernel(ins, outs).launch(grid=[rows, 1, 1], block=[self.tiling.num_threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, ins: tuple, outs: tuple):
        t = self.tiling
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        row_base = Int64(bidx) * t.n
        smem = cutlass.memory.SmemAllocator()
        # warp totals, one buffer per chunk parity: a warp may write chunk c+1's total while
        # a slower one still reads chunk c's, without a second barrier a chunk
        sW = smem.allocate_tensor(Float32, cute.make_layout((t.warps, 2)), 16)
        carry = Float32(self.identity)
        # Two register buffers made before the loop (a buffer made inside it would be one
        # and the same storage every iteration): chunk c+1 loads into one while chunk c,
        # in the other, is scanned.
        bufA = self._alloc(ins)
        bufB = self._alloc(ins)
        if const_expr(t.prefetch):
            self._load(ins, row_base, 0, tidx, bufA)
            for p in cutlass.range(math.ceil(t.chunks / 2), unroll=1):
                self._load(ins, row_base, 2 * p + 1, tidx, bufB)
                carry = self._chunk(bufA, outs, row_base, 2 * p, tidx, sW, carry)
                self._load(ins, row_base, 2 * p + 2, tidx, bufA)
                carry = self._chunk(bufB, outs, row_base, 2 * p + 1, tidx, sW, carry)
        else:
            for c in cutlass.range(t.chunks, unroll=1):
                self._load(ins, row_base, c, tidx, bufA)
                carry = self._chunk(bufA, outs, row_base, c, tidx, sW, carry)

    def _alloc(self, ins: tuple) -> tuple:
        return tuple(cute.make_rmem_tensor(self.tiling.per_thread, x.element_type) for x in ins)

    def _offset(self, c: Int32, tidx: Int32, k: int) -> Int32:
        """Position in the row of element k of thread tidx's run in chunk c (scan order)."""
        t = self.tiling
        logical = c * t.chunk + tidx * t.per_thread + k
        return (t.n - 1 - logical) if const_expr(self.reverse) else logical

    @cute.jit
    def _load(self, ins: tuple, row_base: Int64, c: Int32, tidx: Int32, regs: tuple):
        """Load the thread's run of chunk c of every input into `regs`, in scan order (past the
        row: left as is; the scan reads the identity there)."""
        t = self.tiling
        for i in cutlass.range_constexpr(len(ins)):
            for v in cutlass.range_constexpr(t.per_thread // t.vec):
                first = self._offset(c, tidx, v * t.vec)
                # reversed: the vector's lowest address is its last element in scan order
                lo = (first - (t.vec - 1)) if const_expr(self.reverse) else first
                if (first < t.n) & (first >= 0) & (lo >= 0):
                    vreg = cute.make_rmem_tensor(t.vec, ins[i].element_type)
                    cute.autovec_copy(_at(ins[i], row_base + lo, t.vec), vreg)
                    for j in cutlass.range_constexpr(t.vec):
                        regs[i][v * t.vec + j] = vreg[t.vec - 1 - j] if const_expr(self.reverse) else vreg[j]

    @cute.jit
    def _chunk(self, regs: tuple, outs: tuple, row_base: Int64, c: Int32, tidx: Int32, sW: cute.Tensor, carry):
        t = self.tiling
        ident = Float32(self.identity)
        vals = []
        for k in cutlass.range_constexpr(t.per_thread):
            pos = self._offset(c, tidx, k)
            ok = (pos >= 0) & (pos < t.n)
            v = self.prologue(tuple(r[k] for r in regs))
            vals.append(cutlass.select_(ok, Float32(v), ident))
        total = vals[0]
        for k in cutlass.range_constexpr(1, t.per_thread):
            total = self.combine(total, vals[k])
        # inclusive warp scan of the run totals (Hillis-Steele with shuffles)
        lane, warp = cute.arch.lane_idx(), cute.arch.warp_idx()
        incl = total
        for i in cutlass.range_constexpr(5):
            up = cute.arch.shuffle_sync_up(incl, offset=1 << i)
            incl = cutlass.select_(lane >= (1 << i), self.combine(up, incl), incl)
        excl = cute.arch.shuffle_sync_up(incl, offset=1)
        excl = cutlass.select_(lane == 0, ident, excl)
        parity = c % 2
        if lane == WARP - 1:
            sW[warp, parity] = incl
        cute.arch.barrier()
        # the warps' totals scanned by every warp, lane w holding warp w's: log2(warps) combines
        # a thread where folding them in turn took two a warp (logcumsumexp, whose combine is an
        # exp2 and a log2, spent half its work there: H200 16384^2 fp32 50.8 -> 78.4% of copy)
        w_incl = cutlass.select_(lane < t.warps, sW[cutlass.min(lane, t.warps - 1), parity], ident)
        for i in cutlass.range_constexpr((t.warps - 1).bit_length()):
            up = cute.arch.shuffle_sync_up(w_incl, offset=1 << i)
            w_incl = cutlass.select_(lane >= (1 << i), self.combine(up, w_incl), w_incl)
        # (the combine of the earlier warps' totals, and of all of them)
        before = cutlass.select_(warp == 0, ident, cute.arch.shuffle_sync(w_incl, warp - 1))
        chunk_total = cute.arch.shuffle_sync(w_incl, t.warps - 1)
        running = self.combine(carry, self.combine(before, excl))
        res = cute.make_rmem_tensor(t.per_thread, outs[0].element_type)
        for k in cutlass.range_constexpr(t.per_thread):
            if const_expr(self.exclusive):
                res[k] = outs[0].element_type(running)
                running = self.combine(running, vals[k])
            else:
                running = self.combine(running, vals[k])
                res[k] = outs[0].element_type(running)
        for v in cutlass.range_constexpr(t.per_thread // t.vec):
            first = self._offset(c, tidx, v * t.vec)
            lo = (first - (t.vec - 1)) if const_expr(self.reverse) else first
            if (first < t.n) & (first >= 0) & (lo >= 0):
                vreg = cute.make_rmem_tensor(t.vec, outs[0].element_type)
                for j in cutlass.range_constexpr(t.vec):
                    vreg[j] = res[v * t.vec + (t.vec - 1 - j)] if const_expr(self.reverse) else res[v * t.vec + j]
                cute.autovec_copy(vreg, _at(outs[0], row_base + lo, t.vec))
        return self.combine(carry, chunk_total)


def add(a, b):
    return a + b


def mul(a, b):
    return a * b


def fmax(a, b):
    return cute.arch.fmax(a, b)


def fmin(a, b):
    return cute.arch.fmin(a, b)


LN_2 = math.log(2.0)


def log_add_exp(a, b):
    # log(e^a + e^b) as the larger plus log(1 + e^(smaller - larger)), in (0, ln 2]: no overflow
    # at any magnitude. Where the smaller is -inf (the identity: an empty prefix) or the larger
    # +inf, the difference is NaN or -inf and the larger is the answer.
    hi, lo = cute.arch.fmax(a, b), cute.arch.fmin(a, b)
    r = hi + cute.math.log2(Float32(1.0) + cute.math.exp2((lo - hi) * LOG2_E, fastmath=True), fastmath=True) * LN_2
    return cutlass.select_((lo == -math.inf) | (hi == math.inf), hi, r)
