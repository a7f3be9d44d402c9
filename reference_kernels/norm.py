"""The grouped-normalization template: statistics of groups too large for one CTA's registers
(a LayerNorm over (C, H, W), a GroupNorm's channels, a BatchNorm's batch and spatial dims,
a row of 64K elements), then every element rewritten with its group's statistics.

The input is viewed as (A, G, L): a *segment* is L contiguous elements, group g is the A
segments (a, g, :). Two modes name which of A and G the batch M sizes:
- "groups": A = 1, G = M * groups_per_item (LayerNorm, InstanceNorm, GroupNorm, row norms);
- "segments": A = M, G = groups_per_item (BatchNorm: a channel over the batch).

    stats[g] = finalize(fold(combine, prologue(x, shift) for x in group g), count, shift)
    out[e] = apply(x[e], stats[g], params at e)
    out[g] = stats[g][0]                         (without `apply`: a reduction per group)
    out_i[g] = stats[g][i]                       (several outputs: a max and its index)
    out_i[e] = apply(x[e], stats[g], params)[i]  (with `element_outputs` E > 1: a residual sum
                                                  and its rows normalized)
    out_i[g] = per_group(stats[g])[i - E]        (with `apply`, outputs after the E rewritten:
                                                  the rows' statistics)

With `weighted`, the prologue also takes the parameters' values at the element,
prologue(x, shift, params): a matrix-vector product is rows folded with x * v[l] and no apply.
With `with_index`, it takes the element's index in its group, prologue(x, shift, i): an argmax
of each row folds (x, i) pairs.

`shift` is the group's first element: a mean and variance folded as sums of (x - shift) and
(x - shift)^2 lose nothing to cancellation when the mean is far from 0, and the fold stays a
plain sum (so partial sums of CTAs combine in any grouping). A parameter (a weight, a bias)
of element (g, l) is read at (g % groups_per_item) * param_mul + l // param_div: a
LayerNorm's per-element weight (0, 1), a channel's weight in GroupNorm (C/G, H*W) or in
BatchNorm (1, L).

Five paths, by the group's size, all deterministic:
- a value a group of at most `packed_bytes` bytes: a thread a group, its loads all in flight;
- groups of at most `fused_max` elements (a reduction per group, or a rewrite whose
  parameters the row path does not take): one kernel, a CTA a group folds it, then rewrites
  it (the second read mostly hits L2);
- a rewrite of groups of one segment up to `row_max` elements whose parameters are constant
  over the group, one a column, or of x's shape (an InstanceNorm, an RMSNorm written out with
  its weight, a residual sum and its norm, a row norm of 64K elements): the row template of
  `reduce.py`, the group in the registers of a CTA or a cluster, so it is read once and
  written once, however short the group;
- longer groups held on chip: every CTA folds a chunk of a group into its shared memory, the
  group's CTAs meet at a barrier in global memory (an arrival counter), each folds the group's
  partials in the same fixed order, then rewrites its chunk from shared memory: the input is
  read once. The GPU's shared memory holds a group (k chunks, k <= the CTAs resident at
  once: 2 x 96 KB on each of 132 SMs, 24.75 MB); CTAs take chunks in order from a ticket
  counter, so a group's chunks are all taken before the next group's and every CTA that waits
  waits on CTAs that already run (no deadlock however the GPU schedules them, as long as a CTA
  takes its next chunk only after its group's barrier). The atomics hand out chunks and count
  arrivals; the sums never depend on their order. Two launches: one zeroes the counters (the
  workspace is undefined on entry), one does the work. Not taken where the parameters change
  with every element (a LayerNorm's weight over (C, H, W)): each group would read them again;
- longer groups: three launches on one stream through the caller's workspace (kernel
  contract, `WORKSPACE`):
1. `partials`: k CTAs a group, each folding a chunk in order, write one partial each;
2. `finalize`: a CTA a group folds its k partials in a fixed order into the statistics;
3. `rewrite`: the same k CTAs a group rewrite their chunks.
The partition depends on the shape alone: the same bits every run (no atomics). It reads the
input twice, so its speed of light is 2/3 of a copy's where the groups miss L2.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, const_expr

from reference_kernels import reduce as R
from reference_kernels.reduce import WARP, block_fold, vector_elems
from reference_kernels.reduce import vector_at as _at
from reference_kernels.row_plan import pick
from reference_kernels.tuning import norm as T

MODES = ("groups", "segments")
MAX_ARITY = 3  # values a partial (and the statistics) hold: a Chan merge's (count, mean, m2)
SLOTS = 1 << 19  # partials the workspace holds: groups x chunks a group
WORKSPACE = SLOTS * MAX_ARITY
FINAL_THREADS = 256
CLEAR_THREADS = 256


@dataclass(frozen=True)
class NormKnobs:
    num_threads: int = 256
    vec_bits: int = 128
    unroll: int = 4  # vectors per thread in flight
    chunk: int = 32768  # elements of a group one CTA folds and rewrites
    fused_max: int = 16384  # groups this small: one kernel, a CTA a group
    # a value a group: a thread a group up to these bytes, else CTAs of these threads on the fused
    # path (None: T.PACKED_BYTES, T.FUSED_THREADS by the group's bytes; 0 bytes: never)
    packed_bytes: int | None = None
    fused_threads: int | None = None
    row_max: int = 262144  # groups up to this: in registers on the row template (0: never)
    # The on-chip path: bytes of a group one CTA holds in shared memory, CTAs a SM (their
    # chunks together within the SM's 227 KB), SMs (H100 and H200: 132). 0 bytes: never.
    resident_bytes: int = 98304
    resident_ctas: int = 2
    sms: int = 132


@dataclass(frozen=True)
class NormTiling:
    vec: int
    num_threads: int
    unroll: int
    chunk: int
    fused: bool
    packed: bool = False  # a thread a group
    resident_k: int = 0  # chunks a group on the on-chip path (0: not taken)
    resident_per: int = 0  # elements a chunk there (the last one may be shorter)
    resident_grid: int = 0  # CTAs resident at once: the most chunks in flight

    @property
    def step(self) -> int:
        """Elements a CTA moves per unrolled batch of loads."""
        return self.num_threads * self.vec * self.unroll


def resident_split(knobs: NormKnobs, elem_bits: int, seg_len: int, vec: int) -> tuple[int, int, int]:
    """(k, per, grid) of the on-chip path for groups of `seg_len` elements, or (0, 0, 0) where a
    group needs more chunks than CTAs are resident at once (its barrier could never open)."""
    cap = knobs.resident_bytes * 8 // elem_bits // vec * vec
    grid = knobs.sms * knobs.resident_ctas
    if cap < vec or grid < 1:
        return 0, 0, 0
    k = math.ceil(seg_len / cap)
    per = math.ceil(math.ceil(seg_len / k) / vec) * vec
    if k > grid:
        return 0, 0, 0
    return k, per, grid


def resolve_tiling(knobs: NormKnobs, widest_bits: int, seg_len: int, mode: str, values: bool = False) -> NormTiling:
    """The tiling of groups of `seg_len` elements. `values`: a value a group (no rewrite): a
    thread a group where it is short, else the fused path's threads by the group's bytes."""
    group_bytes = seg_len * widest_bits // 8
    limit = T.PACKED_BYTES if knobs.packed_bytes is None else knobs.packed_bytes
    packed = values and mode == "groups" and group_bytes <= limit
    fused = mode == "groups" and seg_len <= knobs.fused_max
    if values and fused and not packed:
        knobs = dataclasses.replace(knobs, num_threads=knobs.fused_threads or pick(T.FUSED_THREADS, group_bytes))
    if knobs.num_threads % WARP or not WARP <= knobs.num_threads <= 1024:
        raise ValueError(f"num_threads={knobs.num_threads} must be a multiple of 32, <= 1024")
    if not 1 <= knobs.unroll <= 16:
        raise ValueError(f"unroll={knobs.unroll} must be 1..16")
    vec = vector_elems(knobs.vec_bits, widest_bits, seg_len)
    if knobs.chunk < knobs.num_threads * vec:
        raise ValueError(f"chunk={knobs.chunk} must hold a vector for each of {knobs.num_threads} threads")
    return NormTiling(vec, knobs.num_threads, knobs.unroll, knobs.chunk // vec * vec, fused, packed)


def with_resident(t: NormTiling, knobs: NormKnobs, elem_bits: int, seg_len: int) -> NormTiling:
    k, per, grid = resident_split(knobs, elem_bits, seg_len, t.vec)
    return dataclasses.replace(t, resident_k=k, resident_per=per, resident_grid=grid)


class GroupedNorm:
    """Normalize mX over groups (see the module's docstring); `params` are the tensors `apply`
    reads at each element (a weight, a bias), in its order."""

    def __init__(
        self,
        prologue: Callable,
        combine: Callable,
        identity: tuple,
        finalize: Callable,
        apply: Callable | None,
        mode: str,
        groups_per_item: int,
        seg_len: int,
        param_mul: int = 0,
        param_div: int = 1,
        knobs: NormKnobs = NormKnobs(),
        weighted: bool = False,
        param_kinds: tuple[str, ...] = (),
        with_index: bool = False,
        per_group: Callable | None = None,
        element_outputs: int = 1,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if not 1 <= len(identity) <= MAX_ARITY:
            raise ValueError(f"the folded tuple holds 1..{MAX_ARITY} values, got {len(identity)}")
        if groups_per_item < 1 or seg_len < 1 or param_div < 1 or param_mul < 0:
            raise ValueError("groups_per_item, seg_len and param_div must be >= 1, param_mul >= 0")
        if mode == "segments" and groups_per_item > SLOTS:
            raise ValueError(f"at most {SLOTS} groups a batch item in segments mode")
        self.prologue, self.combine, self.identity = prologue, combine, identity
        self.finalize, self.apply, self.mode = finalize, apply, mode
        self.gpi, self.seg_len, self.param_mul, self.param_div = groups_per_item, seg_len, param_mul, param_div
        if any(k not in ("indexed", "full") for k in param_kinds):
            raise ValueError(f"parameter kinds are 'indexed' or 'full', got {param_kinds}")
        # "full": a tensor of x's shape, read where x is (a triplet loss's positive and negative)
        self.knobs, self.weighted, self.param_kinds = knobs, weighted, param_kinds
        # the prologue also takes the element's index in its group (an argmax's)
        if with_index and (weighted or mode != "groups"):
            raise ValueError("an element's index reaches the prologue of unweighted groups only")
        self.with_index = with_index
        # with apply and a tuple of outputs: the first `element_outputs` are rewrites of x (apply's
        # values), the others take per_group's values, one a group
        self.per_group, self.element_outputs = per_group, element_outputs

    @cute.jit
    def __call__(self, mX: cute.Tensor, params: tuple, mO: cute.Tensor, mW: cute.Tensor, stream):
        # mO: the output, or a tuple of outputs: without apply, output i takes finalize's value i;
        # with it, the first is the rewrite and the others take per_group's values, one a group
        if const_expr(
            isinstance(mO, tuple)
            and self.apply is not None
            and self.per_group is None
            and len(mO) > self.element_outputs
        ):
            raise ValueError("a rewrite's outputs after its element outputs need per_group")
        widest = const_expr(max(t.element_type.width for t in (mX, *_outs(mO))))
        self.tiling = resolve_tiling(self.knobs, widest, self.seg_len, self.mode, self.apply is None)
        t = self.tiling
        items = Int64(mX.shape[0])
        if const_expr(self.mode == "groups"):
            groups = items * self.gpi
            count = Int64(self.seg_len)
        else:
            groups = Int64(self.gpi)
            count = items * self.seg_len
        # A rewrite whose group fits a CTA's or a cluster's registers reads x once there, however
        # short the group (the fused path reads it twice): its parameters must be one a group,
        # one a column of the row, or of x's own shape.
        indexed = const_expr(any(self._kind(i) == "indexed" for i in range(len(params))))
        as_rows = const_expr(
            self.apply is not None
            and self.mode == "groups"
            and self.seg_len <= self.knobs.row_max
            and (not indexed or self.param_div % self.seg_len == 0 or self._column_params())
        )
        # Not where the parameters change with every element (a LayerNorm's weight over (C, H, W)):
        # a group would read its own size of them again, where the split path's chunk-major
        # rewrite reads them once for every group (measured: LayerNorm 40, 38% vs 61% of copy).
        if const_expr(
            self.apply is not None
            and self.mode == "groups"
            and not t.fused
            and not as_rows
            and (len(params) == 0 or self.param_div > 1)
        ):
            self.tiling = with_resident(t, self.knobs, mX.element_type.width, self.seg_len)
            t = self.tiling
        if const_expr(as_rows):
            # the tensor as (groups, L) rows
            rows_layout = cute.make_layout((groups, self.seg_len), stride=(self.seg_len, 1))
            mX2 = cute.make_tensor(mX.iterator, rows_layout)
            eo = const_expr(self.element_outputs)
            mO2 = tuple(cute.make_tensor(o.iterator, rows_layout) for o in _outs(mO)[:eo]) + _outs(mO)[eo:]
            if const_expr(not isinstance(mO, tuple)):
                mO2 = mO2[0]
            params2 = tuple(
                cute.make_tensor(p.iterator, rows_layout) if const_expr(self._kind(i) == "full") else p
                for i, p in enumerate(params)
            )
            # a weighted prologue holds its parameters' values beside the row's through the fold
            arrays = const_expr(1 + (sum(1 for i in range(len(params)) if self._row_vector(i)) if self.weighted else 0))
            # (a parameter on the row path is loaded in x's partition, so one wider than x, an fp32
            # weight beside bf16 rows, bounds the vector too: at most 128 bits a load)
            row_widest = const_expr(
                max([widest] + [p.element_type.width for i, p in enumerate(params) if self._row_vector(i)])
            )
            self.row_tiling = R.resolve_tiling(R.RowKnobs(), mX.element_type.width, self.seg_len, row_widest, arrays)
            copy = R.row_tiled_copy(mX.element_type, self.row_tiling)
            R.launch_rows(self.rows(mX2, params2, mO2, copy), self.row_tiling, Int32(groups), stream, waits=True)
        elif const_expr(t.packed):
            self.packed(mX, params, mO, groups).launch(
                grid=[Int32((groups + t.num_threads - 1) // t.num_threads), 1, 1],
                block=[t.num_threads, 1, 1],
                stream=stream,
            )
        elif const_expr(t.fused):
            self.fused(mX, params, mO, groups).launch(
                grid=[Int32(groups), 1, 1], block=[t.num_threads, 1, 1], stream=stream
            )
        elif const_expr(t.resident_k > 0):
            # the workspace holds a partial a chunk and a counter a group, up to some M
            if groups * (t.resident_k * MAX_ARITY + 1) + 1 <= WORKSPACE:
                self._launch_resident(mX, params, mO, mW, groups, stream)
            else:
                self._launch_split(mX, params, mO, mW, groups, count, stream)
        else:
            self._launch_split(mX, params, mO, mW, groups, count, stream)

    @cute.jit
    def _launch_resident(self, mX, params: tuple, mO, mW, groups: Int64, stream):
        t = self.tiling
        # partials first, then the ticket counter and one arrival counter a group
        at = groups * t.resident_k * MAX_ARITY
        words = groups + 1
        self.clear(mW, at, words).launch(
            grid=[Int32((words + CLEAR_THREADS - 1) // CLEAR_THREADS), 1, 1],
            block=[CLEAR_THREADS, 1, 1],
            stream=stream,
        )
        self.resident(mX, params, mO, mW, groups, at).launch(
            grid=[Int32(cutlass.min(groups * t.resident_k, Int64(t.resident_grid))), 1, 1],
            block=[t.num_threads, 1, 1],
            stream=stream,
            min_blocks_per_mp=self.knobs.resident_ctas,
            preferred_smem_carveout=100,
        )

    @cute.jit
    def _launch_split(self, mX, params: tuple, mO, mW, groups: Int64, count: Int64, stream):
        t = self.tiling
        # k chunks a group, as many as the workspace holds partials for
        k = cutlass.max(cutlass.min((count + t.chunk - 1) // t.chunk, SLOTS // groups), Int64(1))
        per = ((count + k - 1) // k + t.vec - 1) // t.vec * t.vec
        grid = Int32(groups * k)
        self.partials(mX, params, mW, groups, count, k, per).launch(
            grid=[grid, 1, 1], block=[t.num_threads, 1, 1], stream=stream
        )
        self.final(mX, mO, mW, groups, count, k).launch(
            grid=[Int32(groups), 1, 1], block=[FINAL_THREADS, 1, 1], stream=stream
        )
        if const_expr(self.apply is not None):
            self.rewrite(mX, params, self._elements(mO), mW, groups, count, k, per).launch(
                grid=[grid, 1, 1], block=[t.num_threads, 1, 1], stream=stream
            )

    # ------------------------------------------------------------------ kernels

    @cute.kernel
    def fused(self, mX: cute.Tensor, params: tuple, mO: cute.Tensor | tuple, groups: Int64):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        g = Int64(bidx)
        n = Int64(self.seg_len)
        shift = Float32(_at(mX, self._offset(g, Int64(0), groups), 1)[0])
        acc = self._fold(mX, params, g, Int64(0), n, shift, groups, tidx)
        acc = block_fold(acc, self.combine, tidx, self.tiling.num_threads)
        stats = self.finalize(acc, Float32(n), shift)
        if const_expr(self.apply is None):
            if tidx == 0:
                _write(mO, g, stats)
        else:
            self._rewrite(mX, params, self._elements(mO), g, Int64(0), n, stats, groups, tidx)
            if const_expr(self._values_a_group(mO)):
                if tidx == 0:
                    self._write_values(mO, g, stats)

    @cute.kernel
    def packed(self, mX: cute.Tensor, params: tuple, mO: cute.Tensor | tuple, groups: Int64):
        """A thread a group, every load of it issued before the fold: groups this short leave a
        CTA's threads idle, and a CTA each is a launch for every few elements."""
        t = self.tiling
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        g = Int64(bidx) * t.num_threads + tidx
        if g < groups:
            loaded = []
            for v in cutlass.range_constexpr(self.seg_len // t.vec):
                r = cute.make_rmem_tensor(t.vec, mX.element_type)
                cute.autovec_copy(_at(mX, self._offset(g, Int64(v * t.vec), groups), t.vec), r)
                loaded.append(r)
            shift = Float32(loaded[0][0])
            acc = tuple(Float32(v) for v in self.identity)
            # folded a fused thread's batch at a time (unroll vectors): a block merge of the whole
            # group loses more to cancellation (a variance of 256 fp32 with a spike first: 1e-4)
            for b in cutlass.range_constexpr(0, len(loaded), t.unroll):
                terms = []
                for v in cutlass.range_constexpr(b, min(b + t.unroll, len(loaded))):
                    terms += self._terms(params, g, Int64(v * t.vec), True, loaded[v], shift, groups)
                acc = R.fold_terms(self.combine, acc, terms)
            _write(mO, g, self.finalize(acc, Float32(self.seg_len), shift))

    @cute.kernel
    def rows(self, mX: cute.Tensor, params: tuple, mO: cute.Tensor | tuple, copy: cute.TiledCopy):
        t = self.row_tiling
        tidx, _, sX, (scratch,) = R.begin_rows(t, mX.element_type, len(self.identity))
        R.for_each_row(t, copy, mX, sX, tidx, 0.0, functools.partial(self._row, mX, params, mO, scratch))

    @cute.jit
    def _row(self, mX, params: tuple, mO, scratch: R.ReductionScratch, ctx: R.RowContext, tXrX):
        t = self.row_tiling
        g = ctx.row
        shift = Float32(0.0)
        if ctx.row_ok:
            shift = Float32(mX[g, 0])
        # a weighted prologue needs the parameters before the fold; apply alone, after it (only
        # the row is live while it is reduced)
        pv = self._row_params(ctx, params, g, tXrX) if const_expr(self.weighted) else None
        terms = []
        for i in cutlass.range_constexpr(cute.size(tXrX)):
            if const_expr(self.with_index):
                term = self.prologue(Float32(tXrX[i]), shift, ctx.tXcX[i][1])
            elif const_expr(self.weighted):
                term = self.prologue(Float32(tXrX[i]), shift, self._at_element(pv, i))
            else:
                term = self.prologue(Float32(tXrX[i]), shift)
            # padding columns are not part of the row
            terms.append((True if const_expr(t.even_n) else ctx.tXcX[i][1] < t.n, term))
        acc = R.fold_terms(self.combine, tuple(Float32(v) for v in self.identity), terms)
        acc = R.row_reduce(acc, self.combine, t, scratch.at(ctx))
        stats = self.finalize(acc, Float32(self.seg_len), shift)
        if const_expr(not self.weighted):
            pv = self._row_params(ctx, params, g, tXrX)
        outs = _outs(self._elements(mO))
        tXrO = [cute.make_rmem_tensor_like(tXrX, Float32) for _ in outs]
        for i in cutlass.range_constexpr(cute.size(tXrX)):
            vals = self.apply(Float32(tXrX[i]), stats, self._at_element(pv, i))
            if const_expr(len(outs) == 1):
                tXrO[0][i] = vals
            else:
                for j in cutlass.range_constexpr(len(outs)):
                    tXrO[j][i] = vals[j]
        if const_expr(self._values_a_group(mO)):
            if ctx.row_ok & ctx.row_leader:
                self._write_values(mO, g, stats)
        for j in cutlass.range_constexpr(len(outs)):
            R.store_row(ctx, tXrO[j].load(), outs[j])

    @cute.jit
    def _row_params(self, ctx: R.RowContext, params: tuple, g: Int32, tXrX) -> list:
        """Each parameter on the row path: registers in the row's partition (x-shaped, or one
        value a column), or one value for the whole group."""
        pv = []
        for i, p in enumerate(params):
            if const_expr(self._kind(i) == "full"):
                v = cute.make_rmem_tensor_like(tXrX)
                R.load_row_into(ctx, p, v, 0.0)
            elif const_expr(self._row_vector(i)):
                v = R.load_columns(ctx, p)
            else:
                v = Float32(0.0)
                if ctx.row_ok:
                    v = Float32(_at(p, (g % self.gpi) * self.param_mul, 1)[0])
            pv.append(v)
        return pv

    def _at_element(self, pv: list, i: int) -> tuple:
        """The parameters' values at element i of the thread's row slice."""
        return tuple(Float32(v[i]) if self._row_vector(k) else v for k, v in enumerate(pv))

    def _kind(self, i: int) -> str:
        return self.param_kinds[i] if i < len(self.param_kinds) else "indexed"

    def _column_params(self) -> bool:
        """Indexed parameters looked up by the element's column alone (a weight over the row)."""
        return self.param_div == 1 and (self.param_mul == 0 or self.gpi == 1)

    def _row_vector(self, i: int) -> bool:
        """Parameter i takes a value an element on the row path (not one a group)."""
        return self._kind(i) == "full" or (self._column_params() and self.param_div % self.seg_len != 0)

    @cute.kernel
    def partials(
        self, mX: cute.Tensor, params: tuple, mW: cute.Tensor, groups: Int64, count: Int64, k: Int64, per: Int64
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        g, j = Int64(bidx) // k, Int64(bidx) % k
        start = j * per
        shift = Float32(_at(mX, self._offset(g, Int64(0), groups), 1)[0])
        acc = self._fold(mX, params, g, start, cutlass.min(start + per, count), shift, groups, tidx)
        acc = block_fold(acc, self.combine, tidx, self.tiling.num_threads)
        if tidx == 0:
            for i in cutlass.range_constexpr(len(acc)):
                mW[Int64(bidx) * MAX_ARITY + i] = acc[i]

    @cute.kernel
    def final(self, mX: cute.Tensor, mO: cute.Tensor | tuple, mW: cute.Tensor, groups: Int64, count: Int64, k: Int64):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        g = Int64(bidx)
        acc = self._fold_partials(mW, g, k, tidx, FINAL_THREADS)
        shift = Float32(_at(mX, self._offset(g, Int64(0), groups), 1)[0])
        stats = self.finalize(acc, Float32(count), shift)
        if tidx == 0:
            if const_expr(self.apply is None):
                _write(mO, g, stats)
            else:
                # over the group's first partial: every thread has read the partials (the fold's barrier)
                for i in cutlass.range_constexpr(len(stats)):
                    mW[g * k * MAX_ARITY + i] = Float32(stats[i])
                if const_expr(self._values_a_group(mO)):
                    self._write_values(mO, g, stats)

    @cute.kernel
    def rewrite(
        self,
        mX: cute.Tensor,
        params: tuple,
        mO: cute.Tensor | tuple,
        mW: cute.Tensor,
        groups: Int64,
        count: Int64,
        k: Int64,
        per: Int64,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        # chunk-major: the groups' CTAs of one chunk run together, so a per-element parameter
        # (a LayerNorm's weight over (C, H, W)) comes from HBM once and from L2 for the rest
        g, j = Int64(bidx) % groups, Int64(bidx) // groups
        start = j * per
        stats = tuple(mW[g * k * MAX_ARITY + i] for i in range(MAX_ARITY))
        self._rewrite(mX, params, mO, g, start, cutlass.min(start + per, count), stats, groups, tidx)

    @cute.kernel
    def clear(self, mW: cute.Tensor, at: Int64, words: Int64):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        i = Int64(bidx) * CLEAR_THREADS + tidx
        counters = self._counters(mW, at)
        if i < words:
            counters[i] = Int32(0)

    @cute.kernel
    def resident(
        self, mX: cute.Tensor, params: tuple, mO: cute.Tensor | tuple, mW: cute.Tensor, groups: Int64, at: Int64
    ):
        t = self.tiling
        k, per = t.resident_k, t.resident_per
        n = self.seg_len
        tidx, _, _ = cute.arch.thread_idx()
        smem = cutlass.memory.SmemAllocator()
        sX = smem.allocate_tensor(mX.element_type, cute.make_layout(per), 16)
        sTicket = smem.allocate_tensor(Int32, cute.make_layout(1), 4)
        counters = self._counters(mW, at)
        if tidx == 0:
            sTicket[0] = cute.arch.atomic_add(counters.iterator, Int32(1), sem="relaxed", scope="gpu")
        cute.arch.barrier()
        ticket = Int64(sTicket[0])
        total = groups * k
        while ticket < total:
            g, j = ticket // k, ticket % k
            start = j * per
            stop = cutlass.min(start + per, Int64(n))
            shift = Float32(_at(mX, self._offset(g, Int64(0), groups), 1)[0])
            acc = self._fold(mX, params, g, start, stop, shift, groups, tidx, sX)
            acc = block_fold(acc, self.combine, tidx, t.num_threads)
            arrived = counters.iterator + 1 + g
            if tidx == 0:
                for i in cutlass.range_constexpr(len(acc)):
                    mW[ticket * MAX_ARITY + i] = acc[i]
                # the partial is visible before the arrival that announces it
                cute.arch.atomic_add(arrived, Int32(1), sem="release", scope="gpu")
                while cute.arch.load(arrived, Int32, sem="acquire", scope="gpu") < k:
                    pass
                # The next chunk is taken only now: a CTA that waited holding a chunk it had not
                # folded could wait on itself (both chunks in one group): a deadlock, seen on the H100.
                # (Every thread read the last ticket before block_fold's barrier.)
                sTicket[0] = cute.arch.atomic_add(counters.iterator, Int32(1), sem="relaxed", scope="gpu")
            cute.arch.barrier()
            # every CTA of the group folds the same partials in the same order: the same bits
            stats = self.finalize(self._fold_partials(mW, g, Int64(k), tidx, t.num_threads), Float32(n), shift)
            self._rewrite(mX, params, self._elements(mO), g, start, stop, stats, groups, tidx, sX)
            if const_expr(self._values_a_group(mO)):
                if (j == 0) & (tidx == 0):  # (every chunk's CTA holds the statistics: the first writes)
                    self._write_values(mO, g, stats)
            ticket = Int64(sTicket[0])

    # ------------------------------------------------------------------ pieces

    def _elements(self, mO: cute.Tensor | tuple) -> cute.Tensor | tuple:
        """The outputs the rewrite writes: one tensor, or (element_outputs > 1) a tuple of them."""
        outs = _outs(mO)
        return outs[0] if const_expr(self.element_outputs == 1) else outs[: self.element_outputs]

    def _values_a_group(self, mO: cute.Tensor | tuple) -> bool:
        return isinstance(mO, tuple) and len(mO) > self.element_outputs

    @cute.jit
    def _write_values(self, mO: tuple, g: Int64, stats: tuple):
        """Group g's values a group, per_group's, to the outputs after the rewritten ones."""
        _write(mO[self.element_outputs :], g, self.per_group(stats))

    @cute.jit
    def _fold_partials(self, mW: cute.Tensor, g: Int64, k: Int64, tidx, threads: cutlass.Constexpr[int]) -> tuple:
        """Group g's k partials folded in a fixed order: thread t folds partials t, t + T, ...,
        then the CTA folds its threads in order. Read from L2 (`cg`): other CTAs wrote them,
        in this kernel on the on-chip path, so the SM's L1 may not have seen them."""
        arity = const_expr(len(self.identity))
        acc = tuple(Float32(v) for v in self.identity)
        for i in cutlass.range(Int32((k + threads - 1) // threads), unroll=1):
            j = Int64(i) * threads + tidx
            slot = (g * k + cutlass.min(j, k - 1)) * MAX_ARITY
            part = tuple(Float32(cute.arch.load(mW.iterator + slot + a, Float32, cop="cg")) for a in range(arity))
            new = self.combine(acc, part)
            acc = tuple(cutlass.select_(j < k, x, y) for x, y in zip(new, acc))
        return block_fold(acc, self.combine, tidx, threads)

    @cute.jit
    def _counters(self, mW: cute.Tensor, at: Int64) -> cute.Tensor:
        """The on-chip path's counters (Int32) in the workspace after its partials."""
        return cute.make_tensor(cute.recast_ptr(mW.iterator + at, dtype=Int32), cute.make_layout(1 << 30))

    @cute.jit
    def _offset(self, g: Int64, f: Int64, groups: Int64) -> Int64:
        """Where element f of group g (in its (a, l) order) lies in the tensor."""
        if const_expr(self.mode == "groups"):
            return g * self.seg_len + f
        else:
            a = f // self.seg_len
            return (a * groups + g) * self.seg_len + (f - a * self.seg_len)

    @cute.jit
    def _loads(
        self,
        mX: cute.Tensor,
        g: Int64,
        start: Int64,
        stop: Int64,
        s: Int32,
        groups: Int64,
        tidx: Int32,
        sX: cute.Tensor | None = None,
    ):
        """Batch s of the thread's vectors in [start, stop): all issued before any is used; from
        the chunk kept in `sX` where given."""
        t = self.tiling
        loaded = []
        for u in cutlass.range_constexpr(t.unroll):
            f = start + (Int64(s) * t.unroll + u) * (t.num_threads * t.vec) + tidx * t.vec
            ok = f < stop
            r = cute.make_rmem_tensor(t.vec, mX.element_type)
            if ok:
                if const_expr(sX is None):
                    cute.autovec_copy(_at(mX, self._offset(g, f, groups), t.vec), r)
                else:
                    cute.autovec_copy(_at(sX, f - start, t.vec), r)
            loaded.append((f, ok, r))
        return loaded

    @cute.jit
    def _fold(
        self,
        mX: cute.Tensor,
        params: tuple,
        g: Int64,
        start: Int64,
        stop: Int64,
        shift: Float32,
        groups: Int64,
        tidx,
        sX: cute.Tensor | None = None,
    ):
        """The thread's fold of its vectors in [start, stop); with `sX`, each vector is also kept
        there at its place in the chunk (the thread reads back only what it wrote)."""
        t = self.tiling
        acc = tuple(Float32(v) for v in self.identity)
        for s in cutlass.range(Int32((stop - start + t.step - 1) // t.step), unroll=1):
            terms = []
            for f, ok, r in self._loads(mX, g, start, stop, s, groups, tidx):
                if const_expr(sX is not None):
                    if ok:
                        cute.autovec_copy(r, _at(sX, f - start, t.vec))
                terms += self._terms(params, g, f, ok, r, shift, groups)
            acc = R.fold_terms(self.combine, acc, terms)
        return acc

    @cute.jit
    def _terms(self, params: tuple, g: Int64, f: Int64, ok, r: cute.Tensor, shift: Float32, groups: Int64) -> list:
        """The prologue's terms of the vector `r`, elements f.. of group g, as (ok, term) pairs."""
        pv = self._params_at(params, g, f, ok, groups) if const_expr(self.weighted) else []
        terms = []
        for e in cutlass.range_constexpr(self.tiling.vec):
            if const_expr(self.weighted):
                term = self.prologue(Float32(r[e]), shift, tuple(Float32(v[e]) for v in pv))
            elif const_expr(self.with_index):
                term = self.prologue(Float32(r[e]), shift, f + e)
            else:
                term = self.prologue(Float32(r[e]), shift)
            terms.append((ok, term))
        return terms

    @cute.jit
    def _params_at(self, params: tuple, g: Int64, f: Int64, ok, groups: Int64) -> list:
        """Each parameter's values at the vector of element f of group g (registers)."""
        t = self.tiling
        vector_params = const_expr(self.param_div == 1 and self.param_mul % t.vec == 0)
        # the element's place in its segment, where a parameter is looked up
        pos = f if const_expr(self.mode == "groups") else f % self.seg_len
        base = (g % self.gpi) * self.param_mul
        pv = []
        for i, p in enumerate(params):
            v = cute.make_rmem_tensor(t.vec, p.element_type)
            full = const_expr(self._kind(i) == "full")
            if ok:
                if const_expr(full):
                    cute.autovec_copy(_at(p, self._offset(g, f, groups), t.vec), v)
                elif const_expr(vector_params):
                    cute.autovec_copy(_at(p, base + pos, t.vec), v)
                elif const_expr(self.param_div % t.vec == 0):
                    # a vector never straddles two parameters (a GroupNorm's channel): one load
                    one = _at(p, base + pos // self.param_div, 1)[0]
                    for e in cutlass.range_constexpr(t.vec):
                        v[e] = one
                else:
                    for e in cutlass.range_constexpr(t.vec):
                        v[e] = _at(p, base + (pos + e) // self.param_div, 1)[0]
            pv.append(v)
        return pv

    @cute.jit
    def _rewrite(
        self,
        mX: cute.Tensor,
        params: tuple,
        mO: cute.Tensor | tuple,
        g: Int64,
        start: Int64,
        stop: Int64,
        stats: tuple,
        groups: Int64,
        tidx,
        sX: cute.Tensor | None = None,
    ):
        """Each of the thread's vectors in [start, stop) rewritten with `stats`: read from the
        input, or with `sX` from where `_fold` kept it."""
        t = self.tiling
        for s in cutlass.range(Int32((stop - start + t.step - 1) // t.step), unroll=1):
            for f, ok, r in self._loads(mX, g, start, stop, s, groups, tidx, sX):
                pv = self._params_at(params, g, f, ok, groups)
                if const_expr(isinstance(mO, tuple)):  # several rewrites: apply gives one value each
                    os = [cute.make_rmem_tensor(t.vec, q.element_type) for q in mO]
                    for e in cutlass.range_constexpr(t.vec):
                        vals = self.apply(Float32(r[e]), stats, tuple(Float32(v[e]) for v in pv))
                        for i in cutlass.range_constexpr(len(mO)):
                            os[i][e] = mO[i].element_type(vals[i])
                    if ok:
                        for i in cutlass.range_constexpr(len(mO)):
                            cute.autovec_copy(os[i], _at(mO[i], self._offset(g, f, groups), t.vec))
                else:
                    o = cute.make_rmem_tensor(t.vec, mO.element_type)
                    for e in cutlass.range_constexpr(t.vec):
                        ps = tuple(Float32(v[e]) for v in pv)
                        o[e] = mO.element_type(self.apply(Float32(r[e]), stats, ps))
                    if ok:
                        cute.autovec_copy(o, _at(mO, self._offset(g, f, groups), t.vec))


# --------------------------------------------------------------------------- mean and variance


def _outs(mO: cute.Tensor | tuple) -> tuple:
    return mO if isinstance(mO, tuple) else (mO,)


@cute.jit
def _write(mO: cute.Tensor | tuple, g: Int64, stats: tuple):
    """Group g's values: output i takes finalize's value i (one output: its first)."""
    outs = _outs(mO)
    for i in cutlass.range_constexpr(len(outs)):
        _at(outs[i], g, 1)[0] = outs[i].element_type(stats[i])


def shifted_moments(x: Float32, shift: Float32) -> tuple:
    """(x - shift, (x - shift)^2): summed, the group's mean and variance without cancellation."""
    d = x - shift
    return (d, d * d)


def mean_rstd(eps: float) -> Callable:
    """finalize for a mean and variance norm: (mean, 1 / sqrt(biased variance + eps))."""

    def finalize(acc: tuple, count: Float32, shift: Float32) -> tuple:
        d = acc[0] / count
        var = cute.arch.fmax(acc[1] / count - d * d, Float32(0.0))
        return (shift + d, cute.math.rsqrt(var + Float32(eps)))

    return finalize
