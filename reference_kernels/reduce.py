"""The row template every row kernel is built on, under one name (`from reference_kernels import
reduce as R`), and the reductions themselves.

A row of N elements is split over `threads_per_row` threads of a CTA and, for long rows,
over the `cluster_n` CTAs of a thread-block cluster. Each thread keeps its slice of the row
in registers (loaded with 128-bit vectors, optionally staged through shared memory by
cp.async), so the row is read from HBM exactly once and written once. A reduction then
climbs four levels:

    registers (per thread)  ->  warp (shuffle butterfly)  ->  block (shared memory)
        ->  cluster (st.async into each peer's shared memory, completing on an mbarrier)

Reductions are over *tuples* with a user `combine`, so a fused (max, sum-of-exp) pair for
softmax costs one trip through each level, not two.

The template's three parts: `row_plan` (host side: knobs, tilings, limit tables, evaluated at
trace time), `row_io` (loads, stores, launches, inlined into each kernel) and this module (the
reductions and their combines). Their names are all here as `R.name`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass.cutlass_dsl import dsl_user_op

from reference_kernels.row_io import (  # noqa: F401 - R's names
    RowContext,
    allocate_staging,
    await_previous_grid,
    chunk_of,
    column_predicate,
    columns_begin,
    columns_end,
    copy_atom,
    copy_row_async,
    fitting_chunks,
    for_each_row,
    launch_kernel,
    launch_rows,
    load_columns,
    load_row,
    load_row_into,
    read_staged_row,
    row_partition,
    row_tiled_copy,
    staged_tile,
    store_row,
    valid_count,
    value_at_column,
    vector_at,
    widen,
    zero_padding,
)
from reference_kernels.row_plan import (  # noqa: F401 - R's names
    COLUMN_MODES,
    MAX_CLUSTER,
    MAX_N,
    REGISTER_VALUES,
    WARP,
    RowKnobs,
    RowTiling,
    fill_knobs,
    pick,
    pick_mode,
    resolve_tiling,
    resolve_with_columns,
    stageable_columns,
    vector_elems,
)

# --------------------------------------------------------------------------- reductions


@cute.jit
def warp_reduce(vals: tuple, combine: Callable, width: cutlass.Constexpr[int]) -> tuple:
    """Butterfly over aligned groups of `width` lanes; every lane ends with the group's result."""
    for i in cutlass.range_constexpr(int(math.log2(width))):
        others = tuple(cute.arch.shuffle_sync_bfly(v, offset=width >> (i + 1)) for v in vals)
        vals = combine(vals, others)
    return vals


@cute.jit
def block_fold(acc: tuple, combine: Callable, tidx: Int32, threads: cutlass.Constexpr[int]) -> tuple:
    """The CTA's fold of every thread's `acc`, the same bits in every thread: a warp butterfly,
    then the warps' results in warp order (fixed, so deterministic). Takes shared memory of
    its own: once per kernel."""
    acc = warp_reduce(acc, combine, WARP)
    warps = const_expr(threads // WARP)
    if const_expr(warps > 1):
        smem = cutlass.memory.SmemAllocator()
        s = smem.allocate_tensor(Float32, cute.make_layout((warps, len(acc))), 16)
        if tidx % WARP == 0:
            for k in cutlass.range_constexpr(len(acc)):
                s[tidx // WARP, k] = acc[k]
        cute.arch.barrier()
        folded = tuple(s[0, k] for k in range(len(acc)))
        for w in cutlass.range_constexpr(1, warps):
            folded = combine(folded, tuple(s[w, k] for k in range(len(acc))))
        acc = folded
    return acc


@dsl_user_op
def _remote_store(vals: tuple, smem_ptr: cute.Pointer, mbar_ptr: cute.Pointer, peer: Int32, *, loc=None, ip=None):
    """st.async 1, 2 or 4 fp32 (one vector) into `peer`'s copy of `smem_ptr`, crediting their
    bytes to its mbarrier: one transaction per warp and peer, whatever the arity."""
    remote = cute.arch.map_dsmem_ptr(smem_ptr, peer, loc=loc, ip=ip).toint(loc=loc, ip=ip)
    remote_mbar = cute.arch.map_dsmem_ptr(mbar_ptr, peer, loc=loc, ip=ip).toint(loc=loc, ip=ip)
    regs = ", ".join(f"{{$r{i + 2}}}" for i in range(len(vals)))
    src, vec = (regs, "") if len(vals) == 1 else (f"{{{regs}}}", f".v{len(vals)}")
    cute.arch.inline_ptx(
        f"st.async.shared::cluster.mbarrier::complete_tx::bytes{vec}.f32 [{{$r0}}], {src}, [{{$r1}}];",
        read_only_args=[Int32(remote), Int32(remote_mbar), *(Float32(v) for v in vals)],
        loc=loc,
        ip=ip,
    )


def _vector_width(arity: int) -> int:
    """Values one slot holds: the arity rounded up to a vector st.async can move (1, 2, 4)."""
    return 1 << (arity - 1).bit_length()


@dataclass
class ReductionScratch:
    """Shared memory for one cross-warp reduction of `arity` fp32 values per row.

    `bufs[i]` has shape (rows_per_cta, (senders, cluster_n), stages), where a row's senders are
    its warps, or with `local` the CTA alone; `mbar` is set for cluster reductions (one barrier
    per stage). `local[i]`, (rows_per_cta, warps_per_row, stages), is where a row's warps meet
    before the CTA's fold goes to the peers (see `allocate_scratch`). `at(ctx)` is one row
    tile's view: its stage's buffers and barrier, the barrier's phase for that tile, and its
    prefetch."""

    bufs: tuple
    mbar: cute.Pointer | None
    phase: Int32 | int = 0
    prefetch: Callable | None = None  # RowContext.prefetch, run once the partials are sent
    local: tuple | None = None

    def at(self, ctx: RowContext) -> ReductionScratch:
        if ctx.tiling.stages == 1:
            return self
        bufs = tuple(b[None, None, ctx.stage] for b in self.bufs)
        local = None if self.local is None else tuple(b[None, None, ctx.stage] for b in self.local)
        mbar = None if self.mbar is None else self.mbar + ctx.stage
        return ReductionScratch(bufs, mbar, ctx.phase, ctx.prefetch, local)

    def senders(self, tiling: RowTiling) -> int:
        """Who sends a row's values to each peer: its warps, or with `local` one warp alone."""
        return 1 if self.local is not None else tiling.warps_per_row


def folds_in_cta(tiling: RowTiling, cta_first: bool) -> bool:
    """Whether a row's warps fold their values in the CTA before one warp sends them to the
    cluster (`cta_first` asked, and there are both warps to fold and peers to send to)."""
    return cta_first and tiling.cluster_n > 1 and tiling.warps_per_row > 1


def scratch_bytes(tiling: RowTiling, arity: int, stages: int = 0, cta_first: bool = False) -> int:
    """The fp32 slots `allocate_scratch` takes, in bytes (its barriers aside)."""
    stages = max(stages, tiling.stages)
    wpr = tiling.warps_per_row
    if folds_in_cta(tiling, cta_first):
        slots = tiling.rows_per_cta * (tiling.cluster_n + wpr) * stages
    else:
        slots = tiling.rows_per_cta * wpr * tiling.cluster_n * stages
    return 4 * _vector_width(arity) * slots


def _slots(smem: cutlass.memory.SmemAllocator, rows: int, senders: tuple | int, stages: int, arity: int) -> tuple:
    """One buffer whose slot (row, senders, stage) holds the `arity` values side by side
    (padded to a vector width, so a warp moves them as one vector); a view a value."""
    width = _vector_width(arity)
    # (the value fastest, then the senders, rows and stages)
    order = (3, (1, 2), 4, 0) if isinstance(senders, tuple) else (2, 1, 3, 0)
    layout = cute.make_ordered_layout((rows, senders, stages, width), order=order)
    buf = smem.allocate_tensor(Float32, layout, byte_alignment=16)
    return tuple(buf[None, None, None, i] for i in range(arity))


def allocate_scratch(
    smem: cutlass.memory.SmemAllocator, tiling: RowTiling, arity: int, stages: int = 0, cta_first: bool = False
) -> ReductionScratch:
    """The reduction's slots, a stage each: (row, (warp, rank)), so that a warp sends each peer
    one vector. `stages`: more than the tiling's where a loop asks for them (see
    `row_reduce_send`). `cta_first` (clusters): the row's warps fold in the CTA first and one
    warp sends the CTA's value, (row, (1, rank)): a cluster of 16 with 16 warps a row sends 16
    vectors a CTA rather than 256, and its slots take a sixteenth of the room, for one CTA
    barrier more a reduction."""
    stages = max(stages, tiling.stages)
    folded = folds_in_cta(tiling, cta_first)
    senders = 1 if folded else tiling.warps_per_row
    bufs = _slots(smem, tiling.rows_per_cta, (senders, tiling.cluster_n), stages, arity)
    local = _slots(smem, tiling.rows_per_cta, tiling.warps_per_row, stages, arity) if folded else None
    mbar = smem.allocate_array(cutlass.Int64, num_elems=stages) if tiling.cluster_n > 1 else None
    if stages == 1:
        bufs = tuple(b[None, None, 0] for b in bufs)
        local = None if local is None else tuple(b[None, None, 0] for b in local)
    return ReductionScratch(bufs, mbar, local=local)


@cute.jit
def init_cluster_barriers(scratches: tuple, tiling: cutlass.Constexpr, tidx: Int32, stages: cutlass.Constexpr[int] = 0):
    """Arm each cluster reduction's mbarrier and tell the peers; `cluster_wait` must come
    before the first remote store (`row_reduce` does it), so no CTA writes into a peer
    whose barrier is not initialised yet. `stages` as given to `allocate_scratch`."""
    if const_expr(tiling.cluster_n > 1):
        if tidx == 0:
            for s in scratches:
                for stage in cutlass.range_constexpr(max(stages, tiling.stages)):
                    cute.arch.mbarrier_init(s.mbar + stage, 1)
        cute.arch.mbarrier_init_fence()
        cute.arch.cluster_arrive_relaxed()


def begin_rows(tiling: RowTiling, dtype: type[cutlass.Numeric], *arities: int) -> tuple:
    """A row kernel's first steps, in the order each needs them: its thread index; the wait on
    the previous grid (before any global memory is touched); the row tile's staging buffer
    (None unless staged); one reduction scratch per arity, cluster barriers armed.
    Returns (tidx, smem, sX, scratches); `smem` allocates whatever the kernel needs after."""
    tidx, _, _ = cute.arch.thread_idx()
    await_previous_grid(tiling)
    smem = cutlass.memory.SmemAllocator()
    sX = allocate_staging(smem, tiling, dtype)
    scratches = tuple(allocate_scratch(smem, tiling, a) for a in arities)
    if scratches:
        init_cluster_barriers(scratches, tiling, tidx)
    return tidx, smem, sX, scratches


@cute.jit
def row_reduce(
    vals: tuple,
    combine: Callable,
    tiling: cutlass.Constexpr,
    scratch: ReductionScratch,
    first_cluster_reduce: cutlass.Constexpr[bool] = True,
) -> tuple:
    """Reduce per-thread partial results `vals` (a tuple of fp32) over the whole row.

    The warp level covers min(threads_per_row, 32) lanes; if a row spans more warps their
    results meet in shared memory, and with a cluster each warp's result is pushed to every
    peer CTA so that all of them finish with the row's total."""
    vals = warp_reduce(vals, combine, min(tiling.threads_per_row, WARP))
    return across_warps(vals, combine, tiling, scratch, first_cluster_reduce)


@cute.jit
def across_warps(
    vals: tuple,
    combine: Callable,
    tiling: cutlass.Constexpr,
    scratch: ReductionScratch,
    first_cluster_reduce: cutlass.Constexpr[bool] = True,
    finish: cutlass.Constexpr = None,
) -> tuple:
    """Combine warp results `vals` (each warp's lanes agree on them) over the row's warps
    and cluster peers. `finish(acc, width)` folds the lanes' slot values in groups of
    `width` lanes (default: a butterfly of `combine`); an op may pass a cheaper exact one."""
    wpr = const_expr(tiling.warps_per_row)
    cn = const_expr(tiling.cluster_n)
    if const_expr(wpr > 1 or cn > 1):
        if const_expr(cn == 1):
            lane, warp = cute.arch.lane_idx(), cute.arch.warp_idx()
            if lane == 0:
                for b, v in zip(scratch.bufs, vals):
                    b[warp // wpr, (warp % wpr, 0)] = v
            _prefetch(scratch)
            cute.arch.barrier()
        else:
            if const_expr(first_cluster_reduce and tiling.row_loop == 1):
                cute.arch.cluster_wait()  # (for_each_row waits once, before its loop)
            _send_to_peers(vals, combine, tiling, scratch)
            _prefetch(scratch)
            cute.arch.mbarrier_wait(scratch.mbar, phase=scratch.phase)
        vals = _fold_slots(combine, tiling, scratch, finish)
    else:
        _prefetch(scratch)
    return vals


@cute.jit
def row_reduce_send(vals: tuple, combine: Callable, tiling: cutlass.Constexpr, scratch: ReductionScratch):
    """The first half of a cluster `row_reduce` (cluster_n > 1), for a loop that overlaps one
    row tile's reduction with the next tile's work: each warp's result is on its way to every
    peer on return. `row_reduce_wait` on the same scratch view gives the total. A stage's
    buffer may then be sent into again only once every peer has waited on it, which a loop
    that sends tile i + 1 before it waits on tile i guarantees with four stages."""
    _send_to_peers(warp_reduce(vals, combine, min(tiling.threads_per_row, WARP)), combine, tiling, scratch)


@cute.jit
def row_reduce_wait(combine: Callable, tiling: cutlass.Constexpr, scratch: ReductionScratch) -> tuple:
    """The row's total from a `row_reduce_send` on this scratch view."""
    cute.arch.mbarrier_wait(scratch.mbar, phase=scratch.phase)
    return _fold_slots(combine, tiling, scratch, None)


@cute.jit
def _send_to_peers(vals: tuple, combine: Callable, tiling: cutlass.Constexpr, scratch: ReductionScratch):
    """Arm this CTA's barrier for the stage, then push this warp's `vals` to every peer (lane p
    to peer p, itself included); with `scratch.local`, the row's fold over its warps instead,
    from its first warp alone."""
    lane, warp = cute.arch.lane_idx(), cute.arch.warp_idx()
    wpr = const_expr(tiling.warps_per_row)
    cn = const_expr(tiling.cluster_n)
    rank = cute.arch.block_idx_in_cluster()
    width = const_expr(_vector_width(len(vals)))
    folded = const_expr(scratch.local is not None)
    senders = const_expr(scratch.senders(tiling))
    if warp == 0:
        with cute.arch.elect_one():
            nbytes = const_expr(tiling.rows_per_cta * senders * cn * 4 * width)
            cute.arch.mbarrier_arrive_and_expect_tx(scratch.mbar, nbytes)
    if const_expr(folded):
        if lane == 0:
            for b, v in zip(scratch.local, vals):
                b[warp // wpr, warp % wpr] = v
        cute.arch.barrier()
        # (a butterfly from lane l holding warp l % wpr's value: a fixed order, so deterministic)
        vals = warp_reduce(tuple(b[warp // wpr, lane % wpr] for b in scratch.local), combine, wpr)
    sends = lane < cn
    if const_expr(folded):
        sends = sends & (warp % wpr == 0)
    if sends:
        b = scratch.bufs[0]
        padded = (*vals, *([Float32(0.0)] * (width - len(vals))))
        _remote_store(
            padded, b.iterator + cute.crd2idx((warp // wpr, (warp % wpr, rank)), b.layout), scratch.mbar, lane
        )


@cute.jit
def _fold_slots(combine: Callable, tiling: cutlass.Constexpr, scratch: ReductionScratch, finish: cutlass.Constexpr):
    """The row's total from the slots every warp (and peer) wrote, in every lane."""
    lane, warp = cute.arch.lane_idx(), cute.arch.warp_idx()
    row = warp // const_expr(tiling.warps_per_row)
    slots = const_expr(scratch.senders(tiling) * tiling.cluster_n)
    # Each lane folds up to ceil(slots/32) partials, then the lanes finish together.
    # Every lane must end with the total, since every thread of the row uses it. With
    # slots <= 32 (a power of two), lane l reads slot l % slots: each aligned group of
    # `slots` lanes holds all partials and a butterfly of that width completes it. Past
    # 32 slots each lane first folds slots/32 of them, then the whole warp butterflies.
    if const_expr(slots <= WARP):
        acc = tuple(b[row, lane % slots] for b in scratch.bufs)
    else:
        acc = tuple(b[row, lane] for b in scratch.bufs)
        for i in cutlass.range_constexpr(1, slots // WARP):
            acc = combine(acc, tuple(b[row, lane + i * WARP] for b in scratch.bufs))
    if const_expr(finish is None):
        return warp_reduce(acc, combine, min(slots, WARP))
    return finish(acc, min(slots, WARP))


def _prefetch(scratch: ReductionScratch) -> None:
    # Here every value of the thread's row slice has been consumed (the partials depend on
    # them), so a staged tile's successor may overwrite its slots; a register-prefetched
    # one's loads, issued here, overlap the reduction's wait.
    if scratch.prefetch is not None:
        scratch.prefetch()


# --------------------------------------------------------------------------- combines


def add(a: tuple, b: tuple) -> tuple:
    return tuple(x + y for x, y in zip(a, b))


def fmax(a: tuple, b: tuple) -> tuple:
    return tuple(cute.arch.fmax(x, y) for x, y in zip(a, b))


def count_mean_m2(a: tuple, b: tuple) -> tuple:
    """Chan et al.'s merge of (count, mean, sum of squared deviations) of two groups: one
    reduction trip for mean and variance, without E[x^2] - E[x]^2's cancellation."""
    n = a[0] + b[0]
    inv = cute.arch.rcp_approx(cute.arch.fmax(n, Float32(1.0)))
    delta = b[1] - a[1]
    # an empty side takes the other's mean as it is (b0 / n rounds for a count of 3): a constant
    # group keeps its mean exactly, so its deviations stay 0 (torch's std of it is 0, x / it nan)
    mean = cutlass.select_(a[0] == Float32(0.0), b[1], a[1] + delta * b[0] * inv)
    m2 = a[2] + b[2] + delta * delta * a[0] * b[0] * inv
    return (n, mean, m2)


def masked(ok, value, fill) -> Float32:
    """`value` where `ok`, else `fill`: a term whose element lies outside the tensor (its
    registers were never loaded) contributes nothing."""
    return value if ok is True else cutlass.select_(ok, value, Float32(fill))


def fold_terms(combine: Callable, acc: tuple, terms: list) -> tuple:
    """`acc` with `terms`, (ok, term) pairs, folded in, in order, a term left out where ok is
    false (True: always in). Where the combine has a block merge (`combine.block`), the terms
    are merged among themselves first and into `acc` once: a Chan merge's division, a log-sum-
    exp's rescaling and an argmax's tie-break then cost once a block, not once an element (in
    16-bit, the per-element merges held a batch variance and a log-sum-exp to 85-88% of copy)."""
    block = getattr(combine, "block", None)
    if block is None or len(terms) == 1:
        return fold_each(combine, acc, terms)
    return combine(acc, block(terms))


def fold_each(combine: Callable, acc: tuple, terms: list) -> tuple:
    """`fold_terms` an element at a time, whatever block merge the combine has."""
    for ok, term in terms:
        new = combine(acc, term)
        acc = new if ok is True else tuple(cutlass.select_(ok, n, a) for n, a in zip(new, acc))
    return acc


def joint(*parts: tuple[Callable, tuple]) -> Callable:
    """Several folds side by side in one tuple, each (combine, identity) over its own slots, in
    order: a sum beside a max (a range's amax and amin, a nanmean's sum and count) in one trip.
    Its block merge is each part's own over its slots (an element-wise fold from its identity
    where the part has none)."""
    spans, k = [], 0
    for combine, identity in parts:
        spans.append((combine, identity, k, k + len(identity)))
        k += len(identity)

    def combine(a: tuple, b: tuple) -> tuple:
        return sum((c(a[lo:hi], b[lo:hi]) for c, _, lo, hi in spans), ())

    def block(terms: list) -> tuple:
        out = ()
        for c, identity, lo, hi in spans:
            own = [(ok, t[lo:hi]) for ok, t in terms]
            b = getattr(c, "block", None)
            out += b(own) if b is not None else fold_terms(c, tuple(Float32(v) for v in identity), own)
        return out

    if any(getattr(c, "block", None) is not None for c, _ in parts):
        combine.block = block
    combine.parts = tuple(c for c, _, _, _ in spans)  # (what a template asks of its folds)
    return combine


def _count_mean_m2_block(terms: list) -> tuple:
    """(count, mean, m2) of the terms at once: their mean, then their squared deviations from
    it (the parallel-axis form of Chan's merge, one division). The mean is taken relative to the
    first term's, so equal terms give exactly their value and no deviation (a fold's terms are
    in order and a masked term is followed only by masked ones: a first term masked leaves the
    block empty)."""
    if all(_known(t[0], 1.0) and _known(t[2], 0.0) for _, t in terms):
        return _unit_terms_block(terms)
    cs = [masked(ok, t[0], 0.0) for ok, t in terms]
    ms = [masked(ok, t[1], 0.0) for ok, t in terms]
    n = functools.reduce(lambda a, b: a + b, cs)
    shift = ms[0]
    mean = functools.reduce(lambda a, b: a + b, [c * (m - shift) for c, m in zip(cs[1:], ms[1:])], Float32(0.0))
    mean = shift + mean * cute.arch.rcp_approx(cute.arch.fmax(n, Float32(1.0)))
    m2 = Float32(0.0)
    for (ok, t), c, m in zip(terms, cs, ms):
        d = m - mean
        m2 = m2 + masked(ok, t[2], 0.0) + c * d * d
    return (n, mean, m2)


def _known(v, value: float) -> bool:
    c = getattr(v, "value", None)  # a literal: a float; a register: an MLIR value (`==` a DSL value)
    return isinstance(c, float) and c == value


def _unit_terms_block(terms: list) -> tuple:
    """The same for elements (count 1, m2 0), in one pass: each term's deviation d from the
    first term, then m2 = sum d^2 - (sum d)^2 / n. The first term is one of the block's, so
    (it - mean)^2 <= m2 and sum d^2 <= (n + 1) m2: the subtraction loses at most log2(n + 1)
    bits (without a shift an offset costs all of them). A load of one
    element masks its deviation, a wider load its sums (the fewer selects). Two passes (the
    mean, then deviations from it) held a bf16 std over the batch dim at 80% of copy (H200)."""
    loads: dict[int, tuple] = {}
    for ok, t in terms:
        loads.setdefault(id(ok), (ok, []))[1].append(t[1])
    total = functools.partial(functools.reduce, lambda a, b: a + b)
    shift = masked(terms[0][0], terms[0][1][1], 0.0)
    n = total([masked(ok, Float32(float(len(xs))), 0.0) for ok, xs in loads.values()])
    s, q = Float32(0.0), Float32(0.0)
    for ok, xs in loads.values():
        if len(xs) == 1:
            d = masked(ok, xs[0] - shift, 0.0)
            s, q = s + d, q + d * d
        else:
            ds = [x - shift for x in xs]
            s = s + masked(ok, total(ds), 0.0)
            q = q + masked(ok, total([d * d for d in ds]), 0.0)
    inv = cute.arch.rcp_approx(cute.arch.fmax(n, Float32(1.0)))
    return (n, shift + s * inv, cute.arch.fmax(q - s * s * inv, Float32(0.0)))


count_mean_m2.block = _count_mean_m2_block


LOG2_E = math.log2(math.e)


def safe_max(m: Float32) -> Float32:
    """A max usable as an exponent offset: an all -inf group gives 0, not NaN."""
    return Float32(cutlass.select_(m == -Float32.inf, Float32(0.0), m))


# A product of many elements carried as (p, k), meaning p * PROD_SCALE^k with |p| kept in
# [1 / PROD_SCALE, PROD_SCALE] (or 0, inf, NaN): no partial product leaves fp32's range where
# the whole product does not. A plain fp32 fold of a whole tensor of 2^19 randn values with a
# few spikes had partials of inf beside partials of 0, and their product NaN where torch's, and
# float64's, is 0. Scaling by a power of two is exact, so each multiply still rounds once.
PROD_SCALE = 2.0**63
# A block's elements multiply plainly in groups of PROD_GROUP, each group brought to range once:
# where every element of a group lies within 2^-PROD_SAFE_EXP..2^PROD_SAFE_EXP, each partial
# product of it does within 2^-120..2^120, normal and finite, so it rounds as the element-wise
# fold's would. Rescaling every element held a whole product to 68% of copy in fp32 and 31% in
# bf16 (H200): compute-bound. A group with a zero, an infinity or an extreme element (about one
# randn value in 41,000 is under 2^-15) takes the element-wise fold.
PROD_GROUP = 8
PROD_SAFE_EXP = 15


def _rescaled(p: Float32, k: Float32) -> tuple:
    mag = cute.math.abs(p)
    big = mag > Float32(PROD_SCALE)
    small = (mag < Float32(1.0 / PROD_SCALE)) & (p != Float32(0.0))
    p = cutlass.select_(big, p * Float32(1.0 / PROD_SCALE), cutlass.select_(small, p * Float32(PROD_SCALE), p))
    return (p, k + cutlass.select_(big, Float32(1.0), cutlass.select_(small, Float32(-1.0), Float32(0.0))))


def scaled(x: Float32) -> tuple:
    """An element as a scaled product (p, k): two steps reach any fp32 value, 2^-149 to 2^128."""
    p, k = _rescaled(x, Float32(0.0))
    return _rescaled(p, k)


def prod_term(x: Float32) -> tuple:
    """An element as a product's term, (x, 0) and not yet in range: `scaled_mul` brings it there,
    a block of them mostly with one multiply an element (`scaled_mul.block`)."""
    return (x, Float32(0.0))


def scaled_mul(a: tuple, b: tuple) -> tuple:
    """(p, k) pairs multiplied: their p's product (in [2^-126, 2^126]) brought back to range. A
    term as `prod_term` gives it (its k the literal 0) is brought to range first."""
    if _known(b[1], 0.0):
        b = scaled(b[0])
    return _rescaled(a[0] * b[0], a[1] + b[1])


def _product_of_terms(terms: list) -> tuple:
    """The product of `prod_term`s, (ok, term) pairs, as (p, k): a group at a time."""
    if not all(_known(t[1], 0.0) for _, t in terms):
        return fold_each(scaled_mul, (Float32(1.0), Float32(0.0)), terms)
    xs = [masked(ok, t[0], 1.0) for ok, t in terms]
    acc = _group_product(tuple(xs[:PROD_GROUP]))
    for i in range(PROD_GROUP, len(xs), PROD_GROUP):
        acc = scaled_mul(acc, _group_product(tuple(xs[i : i + PROD_GROUP])))
    return acc


@cute.jit
def _group_product(xs: tuple) -> tuple:
    """The product of a group of elements as (p, k): plainly where every partial stays normal."""
    mags = [cute.math.abs(x) for x in xs]
    lo, hi = functools.reduce(cute.arch.fmin, mags), functools.reduce(cute.arch.fmax, mags)
    p, k = Float32(1.0), Float32(0.0)
    if (lo >= Float32(2.0**-PROD_SAFE_EXP)) & (hi <= Float32(2.0**PROD_SAFE_EXP)):
        p, k = _rescaled(_plain_product(xs), Float32(0.0))
    else:
        p, k = fold_each(scaled_mul, (Float32(1.0), Float32(0.0)), [(True, prod_term(x)) for x in xs])
    return p, k


def _plain_product(xs: tuple) -> Float32:
    return functools.reduce(lambda a, b: a * b, xs)


scaled_mul.block = _product_of_terms


def unscaled(p: Float32, k: Float32) -> Float32:
    """p * PROD_SCALE^k, as fp32 holds it: past four steps either way it is inf or 0."""
    for i in range(4):
        up = cutlass.select_(k < Float32(-i), Float32(1.0 / PROD_SCALE), Float32(1.0))
        p = p * cutlass.select_(k > Float32(i), Float32(PROD_SCALE), up)
    return p


def max_sumexp(a: tuple, b: tuple) -> tuple:
    """(m, s) pairs meaning s * exp(m): merge two such partial sums of exponentials, with one
    exponential (the smaller max's sum scaled to the larger's: a fold that merges an element at
    a time is otherwise two exponentials an element, and bound by them in bf16)."""
    a_big = a[0] >= b[0]
    m = cutlass.select_(a_big, a[0], b[0])
    low = cutlass.select_(a_big, b[0], a[0])
    scale = cute.math.exp2((low - safe_max(m)) * LOG2_E, fastmath=True)
    return (m, cutlass.select_(a_big, a[1], b[1]) + cutlass.select_(a_big, b[1], a[1]) * scale)


def _max_sumexp_block(terms: list) -> tuple:
    """(m, s) of the terms at once: their max, then each term's sum scaled to it (an
    exponential a term and none for the merges). A +inf max scales against 0, so the sum is
    inf and the log-sum-exp inf, as the element-wise merge gives."""
    xs = [masked(ok, t[0], -math.inf) for ok, t in terms]
    m = functools.reduce(cute.arch.fmax, xs)
    at = cutlass.select_(m == Float32.inf, Float32(0.0), safe_max(m))
    s = Float32(0.0)
    for (ok, t), x in zip(terms, xs):
        s = s + masked(ok, t[1], 0.0) * cute.math.exp2((x - at) * LOG2_E, fastmath=True)
    return (m, s)


max_sumexp.block = _max_sumexp_block


def finish_max_sumexp(acc: tuple, width: int) -> tuple:
    """`max_sumexp` over `width` lanes, exactly, with one exponential a lane: the max first
    (a plain butterfly), then each partial sum scaled to it and added up."""
    (m,) = warp_reduce((acc[0],), fmax, width)
    s = acc[1] * cute.math.exp2((acc[0] - safe_max(m)) * LOG2_E, fastmath=True)
    (s,) = warp_reduce((s,), add, width)
    return (m, s)


@cute.jit
def softmax_stats(
    x: cute.TensorSSA, tiling: cutlass.Constexpr, online: cutlass.Constexpr[bool], scratch_a, scratch_b,
    fma: cutlass.Constexpr[bool] = False,
):  # fmt: skip
    """Row max M and sum of exp(x - M), plus exp(x - M) for this thread's values (`fma`: in
    `exp_offset`'s one-FFMA form).

    online: exponentiate against the warp's max (a plain max butterfly first), so the warp
    level sums without rescaling; one fused (max, sum) reduction across warps and CTAs, then
    rescale the local exponentials. Each level costs a butterfly, not an exponential a step.
    two-pass: reduce the max, exponentiate against it, reduce the sum."""
    m_local = x.reduce(cute.ReductionOp.MAX, init_val=-Float32.inf, reduction_profile=0)
    if const_expr(online):
        width = const_expr(min(tiling.threads_per_row, WARP))
        (m_warp,) = warp_reduce((m_local,), fmax, width)
        mw = safe_max(m_warp)
        e = exp_offset(x, mw, fma)
        s_local = e.reduce(cute.ReductionOp.ADD, init_val=0.0, reduction_profile=0)
        (s_warp,) = warp_reduce((s_local,), add, width)
        m, s = across_warps((m_warp, s_warp), max_sumexp, tiling, scratch_a, finish=finish_max_sumexp)
        if const_expr(tiling.warps_per_row > 1 or tiling.cluster_n > 1):
            e = e * cute.math.exp2((mw - safe_max(m)) * LOG2_E, fastmath=True)
    else:
        (m,) = row_reduce((m_local,), fmax, tiling, scratch_a)
        e = exp_offset(x, safe_max(m), fma)
        s_local = e.reduce(cute.ReductionOp.ADD, init_val=0.0, reduction_profile=0)
        (s,) = row_reduce((s_local,), add, tiling, scratch_b, first_cluster_reduce=False)
    return m, s, e


def exp_offset(x: cute.TensorSSA, m: Float32, fma: bool = False) -> cute.TensorSSA:
    """exp(x - m): as exp2((x - m) * log2e), exact 0 at the max; with `fma`, exp2(x * log2e -
    m * log2e), one FFMA a value where the other takes an FADD and an FMUL, off by the rounding of
    m * log2e (2.4e-4 relative at |x| = 4000, 3e-6 at 64), as QuACK computes them. On a short row,
    a few instructions a value, that is a tenth of them; an op's table says where to take it."""
    if fma:
        return cute.math.exp2(x * LOG2_E - m * LOG2_E, fastmath=True)
    return cute.math.exp2((x - m) * LOG2_E, fastmath=True)
