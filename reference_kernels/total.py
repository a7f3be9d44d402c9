"""The whole-tensor reduction template: every element of N inputs folded into one value (a loss,
a norm), deterministically, over as many CTAs as the GPU holds.

    acc = fold(combine, prologue(in_0[e], ..., in_k[e]) for every element e)
    acc = fold(combine, prologue(in_0[e], ..., e) ...)   (with `with_index`: a whole argmax)
    out = epilogue(acc, rows, count)             (a scalar per output)
    out[e] = rewrite(in_0[e], epilogue(...))     (with `rewrite`: x / ||x||)

Three launches on one stream, through a workspace the caller passes (kernel contract,
`WORKSPACE`):
1. `partials`: a fixed grid of `ctas` CTAs walks the tensor grid-strided, each thread folding
   its vectors in order with `unroll` 128-bit loads in flight, then the CTA folds its threads
   (warp butterfly, then its warps in order) and writes one partial per CTA;
2. `final`: one CTA folds the partials in a fixed order and writes the epilogue's values;
3. `rewrite` (optional): every element rewritten with them, as the map template would.
The partition depends on the tensor's size alone, so every run gives the same bits (no atomics).

Operands: "full" inputs have the first input's shape; a "col" input holds one value per index
of the last dim (shape (last,), broadcast along the rest: a hinge loss's targets).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, const_expr

from reference_kernels import reduce as R
from reference_kernels.reduce import WARP, block_fold, pick, vector_elems
from reference_kernels.reduce import vector_at as _at
from reference_kernels.tuning import total as T

KINDS = ("full", "col")
MAX_CTAS = 2048
MAX_ARITY = 4
# fp32 elements of scratch the caller passes: a partial per CTA and slot, then the final values
WORKSPACE = (MAX_CTAS + 1) * MAX_ARITY
FINAL_THREADS = 1024
# A reduced loss whose rows come first (cross-entropy, a triplet loss): one value a row in the
# scratch after the partials, then the total of those; MAX_ROWS rows a pass (fold_row_chunks).
ROWS_WORKSPACE = 1 << 20
# a pass starts at a multiple of PASS_ALIGN rows, so its rows' vectors keep the tensor's alignment
# (the templates' row stages assume it of `start`)
PASS_ALIGN = 1024
MAX_ROWS = (ROWS_WORKSPACE - WORKSPACE) // PASS_ALIGN * PASS_ALIGN


def row_values_and_partials(mW: cute.Tensor, rows) -> tuple[cute.Tensor, cute.Tensor]:
    """Views of a ROWS_WORKSPACE scratch: `rows` fp32 values a row stage writes, and the
    partials the total folds them through."""
    values = cute.make_tensor(mW.iterator + WORKSPACE, cute.make_layout((rows,)))
    return values, cute.make_tensor(mW.iterator, cute.make_layout((WORKSPACE,)))


@dataclass(frozen=True)
class TotalKnobs:
    num_threads: int = 256
    ctas: int | None = None  # None: T.CTAS's, by the fold's arity
    vec_bits: int = 128
    unroll: int = 4  # vectors per thread per input in flight
    # Each CTA walks its own contiguous range instead of striding with the grid. None: only where a
    # "col" operand is read, whose values each CTA then finds in its L1 (H100, hinge loss 32768^2:
    # 3.10 against 2.99 TB/s; MSE and KL divergence within 2% either way).
    contiguous: bool | None = None


@dataclass(frozen=True)
class TotalTiling:
    vec: int
    num_threads: int
    ctas: int
    unroll: int
    contiguous: bool = False

    @property
    def stride(self) -> int:
        """Vectors the whole grid moves per unrolled load."""
        return self.ctas * self.num_threads


def resolve_tiling(
    knobs: TotalKnobs, widest_bits: int, last: int, kinds: tuple[str, ...] = ("full",), arity: int = 1
) -> TotalTiling:
    """Vectors as wide as the knobs allow while a run of the last dim starts aligned to them
    (so a "col" operand's vector is contiguous)."""
    if knobs.num_threads % WARP or not WARP <= knobs.num_threads <= 1024:
        raise ValueError(f"num_threads={knobs.num_threads} must be a multiple of 32, <= 1024")
    ctas = pick(T.CTAS, arity) if knobs.ctas is None else knobs.ctas
    if not 1 <= ctas <= MAX_CTAS:
        raise ValueError(f"ctas={ctas} must be 1..{MAX_CTAS} (the workspace holds that many partials)")
    if not 1 <= knobs.unroll <= 16:
        raise ValueError(f"unroll={knobs.unroll} must be 1..16")
    vec = vector_elems(knobs.vec_bits, widest_bits, last)
    contiguous = "col" in kinds if knobs.contiguous is None else knobs.contiguous
    return TotalTiling(vec, knobs.num_threads, ctas, knobs.unroll, contiguous)


class TotalReduce:
    """Fold every element of `ins` into `identity`-shaped tuples with `combine`; `prologue(xs,
    scalars)` maps one element of each input (fp32) to a tuple, `epilogue(acc, rows, count)`
    turns the total into the outputs' values (rows: the leading dim, count: the elements).
    With `with_index`, the prologue also takes the element's flat index, prologue(xs, scalars,
    e): a whole tensor's argmax folds (x, e) pairs."""

    def __init__(
        self,
        prologue: Callable,
        combine: Callable,
        identity: tuple,
        epilogue: Callable,
        kinds: tuple[str, ...],
        rewrite: Callable | None = None,
        knobs: TotalKnobs = TotalKnobs(),
        with_index: bool = False,
    ) -> None:
        if any(k not in KINDS for k in kinds) or kinds[0] != "full":
            raise ValueError(f"input kinds must be among {KINDS}, the first one full; got {kinds}")
        if not 1 <= len(identity) <= MAX_ARITY:
            raise ValueError(f"the reduced tuple holds 1..{MAX_ARITY} values, got {len(identity)}")
        self.prologue, self.combine, self.identity, self.epilogue = prologue, combine, identity, epilogue
        self.kinds, self.rewrite, self.knobs, self.with_index = kinds, rewrite, knobs, with_index
        # launched as programmatic dependents, each kernel waiting for the grid before it (set at
        # trace time by a caller whose row kernel launched so: the total reads what that wrote)
        self.dependent = False

    @cute.jit
    def __call__(self, ins: tuple, outs: tuple, scalars: tuple, mW: cute.Tensor, stream):
        ref = ins[0]
        rows = Int64(ref.shape[0])
        total = rows * const_expr(math.prod(ref.shape[1:]) if cute.rank(ref) > 1 else 1)
        self.fold(ins, scalars, mW, stream)
        self.finish(outs, mW, rows, total, stream)
        if const_expr(self.rewrite is not None):
            t = self.tiling
            tile = t.num_threads * t.unroll * t.vec
            grid = Int32((total + tile - 1) // tile)
            self.rewrite_all(ref, outs[0], mW, total).launch(
                grid=[grid, 1, 1], block=[t.num_threads, 1, 1], stream=stream, use_pdl=self.dependent
            )

    @cute.jit
    def fold(self, ins: tuple, scalars: tuple, mW: cute.Tensor, stream, accumulate: cutlass.Constexpr[bool] = False):
        """The partials stage alone: each CTA's fold of its share of `ins` into its partial, or,
        with `accumulate`, combined after the partial already there (a caller that folds a tensor
        too large for one pass in chunks, in order: the same bits every run)."""
        ref = ins[0]
        inner = const_expr(math.prod(ref.shape[1:]) if cute.rank(ref) > 1 else 1)
        last = const_expr(ref.shape[cute.rank(ref) - 1] if cute.rank(ref) > 1 else 1)
        widest = const_expr(max(t.element_type.width for t in ins))
        self.tiling = resolve_tiling(self.knobs, widest, last, self.kinds, len(self.identity))
        t = self.tiling
        total = Int64(ref.shape[0]) * inner
        self.partials(ins, scalars, mW, total // t.vec, last, accumulate).launch(
            grid=[t.ctas, 1, 1], block=[t.num_threads, 1, 1], stream=stream, use_pdl=self.dependent
        )

    @cute.jit
    def finish(self, outs: tuple, mW: cute.Tensor, rows: Int64, total: Int64, stream):
        """The final stage alone: the partials folded, the epilogue given `rows` and `total`
        elements (of every chunk folded)."""
        self.final(outs, mW, rows, total).launch(
            grid=[1, 1, 1], block=[FINAL_THREADS, 1, 1], stream=stream, use_pdl=self.dependent
        )

    @cute.kernel
    def partials(
        self,
        ins: tuple,
        scalars: tuple,
        mW: cute.Tensor,
        nvec: Int64,
        last: cutlass.Constexpr[int],
        accumulate: cutlass.Constexpr[bool],
    ):
        t = self.tiling
        if const_expr(self.dependent):
            cute.arch.griddepcontrol_wait()
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        per_step = t.stride * t.unroll
        steps = Int32((nvec + per_step - 1) // per_step)
        if const_expr(t.contiguous):
            # as many steps, but CTA b owns the range of vectors [b, b + 1) * steps * threads *
            # unroll, through which its threads stride by the CTA alone
            tid, stride = Int64(bidx) * steps * (t.num_threads * t.unroll) + tidx, Int64(t.num_threads)
        else:
            tid, stride = Int64(bidx) * t.num_threads + tidx, Int64(t.stride)
        acc = tuple(Float32(v) for v in self.identity)
        for s in cutlass.range(steps, unroll=1):
            # every load of the step first, so `unroll` vectors per input are in flight
            loaded = []
            for u in cutlass.range_constexpr(t.unroll):
                i = (Int64(s) * t.unroll + u) * stride + tid
                ok = i < nvec
                e = cute.assume(i * t.vec, divby=t.vec)
                vals = []
                for k in cutlass.range_constexpr(len(self.kinds)):
                    r = cute.make_rmem_tensor(t.vec, ins[k].element_type)
                    if ok:
                        at = e if const_expr(self.kinds[k] == "full") else cute.assume(e % last, divby=t.vec)
                        cute.autovec_copy(_at(ins[k], at, t.vec), r)
                    vals.append(r)
                loaded.append((ok, vals, e))
            terms = [
                (ok, self.prologue(tuple(Float32(v[j]) for v in vals), scalars, *self._index(e, j)))
                for ok, vals, e in loaded
                for j in range(t.vec)
            ]
            acc = R.fold_terms(self.combine, acc, terms)
        acc = block_fold(acc, self.combine, tidx, t.num_threads)
        if tidx == 0:
            if const_expr(accumulate):
                acc = self.combine(tuple(mW[Int32(bidx) * MAX_ARITY + k] for k in range(len(acc))), acc)
            for k in cutlass.range_constexpr(len(acc)):
                mW[Int32(bidx) * MAX_ARITY + k] = acc[k]

    def _index(self, e: Int64, j: int) -> tuple:
        """The prologue's extra argument: element e + j's flat index, with `with_index`."""
        return (e + j,) if self.with_index else ()

    @cute.kernel
    def final(self, outs: tuple, mW: cute.Tensor, rows: Int64, total: Int64):
        t = self.tiling
        if const_expr(self.dependent):
            cute.arch.griddepcontrol_wait()
        tidx, _, _ = cute.arch.thread_idx()
        acc = tuple(Float32(v) for v in self.identity)
        for c in cutlass.range_constexpr(math.ceil(t.ctas / FINAL_THREADS)):
            cta = c * FINAL_THREADS + tidx  # < MAX_CTAS: inside the workspace, read or not
            new = self.combine(acc, tuple(mW[cta * MAX_ARITY + k] for k in range(len(acc))))
            acc = tuple(cutlass.select_(cta < t.ctas, n, a) for n, a in zip(new, acc))
        acc = block_fold(acc, self.combine, tidx, FINAL_THREADS)
        if tidx == 0:
            res = self.epilogue(acc, Float32(rows), Float32(total))
            if const_expr(self.rewrite is None):
                for i in cutlass.range_constexpr(len(outs)):
                    _at(outs[i], 0, 1)[0] = outs[i].element_type(res[i])
            else:
                for k in cutlass.range_constexpr(len(res)):
                    mW[MAX_CTAS * MAX_ARITY + k] = Float32(res[k])

    @cute.kernel
    def rewrite_all(self, mX: cute.Tensor, mO: cute.Tensor, mW: cute.Tensor, total: Int64):
        t = self.tiling
        if const_expr(self.dependent):
            cute.arch.griddepcontrol_wait()
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        stats = tuple(mW[MAX_CTAS * MAX_ARITY + k] for k in range(MAX_ARITY))
        start = Int64(bidx) * (t.num_threads * t.unroll * t.vec)
        loaded = []
        for u in cutlass.range_constexpr(t.unroll):
            e = cute.assume(start + (u * t.num_threads + tidx) * t.vec, divby=t.vec)
            r = cute.make_rmem_tensor(t.vec, mX.element_type)
            if e < total:
                cute.autovec_copy(_at(mX, e, t.vec), r)
            loaded.append((e, r))
        for e, r in loaded:
            o = cute.make_rmem_tensor(t.vec, mO.element_type)
            for j in cutlass.range_constexpr(t.vec):
                o[j] = mO.element_type(self.rewrite(Float32(r[j]), stats))
            if e < total:
                cute.autovec_copy(o, _at(mO, e, t.vec))


@cute.jit
def fold_row_chunks(stage: Callable, total: TotalReduce, outs: tuple, rows: Int64, mW: cute.Tensor, stream):
    """A loss of `rows` rows through a ROWS_WORKSPACE scratch: `stage(start, n, values)` launches
    the row stage on rows [start, start + n), writing their values, and returns what `total`
    folds; MAX_ROWS rows a pass, each pass's partials combined after the last's (in order: the
    same bits every run), then the epilogue over all of them. One pass below MAX_ROWS rows."""
    first = cutlass.min(rows, Int64(MAX_ROWS))
    values, partials = row_values_and_partials(mW, first)
    total.fold(stage(Int64(0), first, values), (), partials, stream)
    for c in cutlass.range(Int64(1), (rows + MAX_ROWS - 1) // MAX_ROWS, unroll=1):
        start = cute.assume(c * MAX_ROWS, divby=MAX_ROWS)
        n = cutlass.min(rows - start, Int64(MAX_ROWS))
        _fold_again(total, stage(start, n, row_values_and_partials(mW, n)[0]), partials, stream)
    total.finish(outs, partials, rows, rows, stream)


def pass_rows(t: cute.Tensor, start: Int64, n: Int64, row) -> cute.Tensor:
    """Rows [start, start + n) of `t`, rows of `row` elements: a pass's share of a row stage's
    input (`start` a multiple of PASS_ALIGN, so its vectors keep the tensor's alignment)."""
    return cute.make_tensor(
        t.iterator + cute.assume(start * row, divby=PASS_ALIGN), cute.make_layout((n, row), stride=(row, 1))
    )


def _fold_again(total: TotalReduce, ins: tuple, partials: cute.Tensor, stream) -> None:
    # (a function, not a method call in the loop: the DSL carries through a dynamic loop every
    # object whose method the body calls, and a TotalReduce cannot be carried)
    total.fold(ins, (), partials, stream, True)
