"""The row template's device side for data: how a thread's slice of a row is copied in (directly
or staged through shared memory by cp.async), where it sits (`RowContext`), how per-column
vectors (a norm's weight) line up with it, how rows are looped over and written back, and how
the kernel is launched (a programmatic dependent where the tiling says).

Every function here is inlined into an op's kernel; the reductions over what a thread holds
are in reference_kernels.reduce.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import cpasync

from reference_kernels.row_plan import RowTiling


def copy_atom(dtype: type[cutlass.Numeric], vec: int, is_async: bool = False) -> cute.CopyAtom:
    op = cpasync.CopyG2SOp() if is_async else cute.nvgpu.CopyUniversalOp()
    return cute.make_copy_atom(op, dtype, num_bits_per_copy=vec * dtype.width)


def row_tiled_copy(dtype: type[cutlass.Numeric], tiling: RowTiling, is_async: bool = False) -> cute.TiledCopy:
    """Threads laid row-major over (rows_per_cta, threads_per_row), each moving `vec` elements:
    consecutive lanes touch consecutive vectors, so every warp access is coalesced."""
    thr_layout = cute.make_ordered_layout((tiling.rows_per_cta, tiling.threads_per_row), order=(1, 0))
    val_layout = cute.make_layout((1, tiling.vec))
    return cute.make_tiled_copy_tv(copy_atom(dtype, tiling.vec, is_async), thr_layout, val_layout)


def vector_at(m: cute.Tensor, e, vec: int) -> cute.Tensor:
    """`vec` contiguous elements of `m` (flat, row-major) from element `e`, a 64-bit offset and
    a multiple of `vec` (so the vector keeps the tensor's alignment: 128-bit accesses for fp32
    x 4): how the map, strided and scan templates address tensors past 2^31 elements."""
    return cute.make_tensor(m.iterator + cute.assume(e, divby=vec), cute.make_layout(vec))


@cute.jit
def column_predicate(tXcX: cute.Tensor, n: cutlass.Constexpr[int]) -> cute.Tensor:
    """One flag per vector of the thread's partition: is its column inside the row?"""
    pred = cute.make_rmem_tensor(
        cute.make_layout(
            (cute.size(tXcX, mode=[0, 1]), cute.size(tXcX, mode=[1]), cute.size(tXcX, mode=[2])),
            stride=(cute.size(tXcX, mode=[2]), 0, 1),
        ),
        cutlass.Boolean,
    )
    for v in cutlass.range_constexpr(pred.shape[0]):
        for k in cutlass.range_constexpr(pred.shape[2]):
            pred[v, 0, k] = cute.elem_less(tXcX[(0, v), 0, k][1], n)
    return pred


def launch_rows(kernel, tiling: RowTiling, m: Int32, stream, waits: bool = False) -> None:
    """Grid: one CTA per `row_loop` tiles of `rows_per_cta` rows, times `cluster_n` CTAs
    along each row; `waits` as `launch_kernel`'s."""
    occupancy = {}
    if tiling.min_ctas_per_sm:
        # with the carveout given, the DSL does not ask a (possibly absent) GPU for it
        occupancy = {"min_blocks_per_mp": tiling.min_ctas_per_sm, "preferred_smem_carveout": 100}
    launch_kernel(
        kernel,
        tiling,
        stream,
        waits,
        grid=[cute.ceil_div(cute.ceil_div(m, tiling.rows_per_cta), tiling.row_loop), tiling.cluster_n, 1],
        block=[tiling.num_threads, 1, 1],
        cluster=[1, tiling.cluster_n, 1] if tiling.cluster_n > 1 else None,
        **occupancy,
    )


def launch_kernel(kernel, tiling: RowTiling, stream, waits: bool, **config) -> None:
    """`kernel.launch(**config)` on `stream`. `waits`: the kernel calls `await_previous_grid`
    before it touches global memory, so it may launch as a programmatic dependent where the
    tiling says (RowTiling.dependent_launch). A kernel that does not say so (a candidate's,
    written without the wait) is launched plainly; one that says so and never waits is an
    error."""
    dependent = waits and tiling.dependent_launch
    _awaited.discard(tiling)
    kernel.launch(stream=stream, use_pdl=dependent, **config)
    # (the kernel's body is traced inside its launch)
    if dependent and tiling not in _awaited:
        raise ValueError("a launch that waits: the kernel never called await_previous_grid")


_awaited: set[RowTiling] = set()  # trace time: tilings whose kernel, traced last, has waited


def await_previous_grid(tiling: RowTiling) -> None:
    """A dependent launch's first step: the stream's previous grid may still be running, so
    wait until it has ended and its writes are visible. (The inputs may be its outputs, and
    it may still read what this kernel writes.)"""
    if tiling.dependent_launch:
        cute.arch.griddepcontrol_wait()
        _awaited.add(tiling)


def allocate_staging(
    smem: cutlass.memory.SmemAllocator, tiling: RowTiling, dtype: type[cutlass.Numeric], depth: int = 1
):
    """The row tile's shared-memory buffer when staged, else None; with `depth` > 1, that many
    tiles' buffers (a third mode; `staged_tile` picks one)."""
    if not tiling.stage_smem:
        return None
    if depth == 1:
        layout = cute.make_ordered_layout(tiling.tiler_mn, order=(1, 0))
    else:
        layout = cute.make_ordered_layout((*tiling.tiler_mn, depth), order=(1, 0, 2))
    return smem.allocate_tensor(dtype, layout, byte_alignment=16)


def staged_tile(sX: cute.Tensor, depth: int, k: Int32 | int) -> cute.Tensor:
    """Buffer `k` (a dynamic index is fine) of a staging allocated with `depth` tiles."""
    return sX if depth == 1 else sX[None, None, k]


@dataclass
class RowContext:
    """Where this thread sits: its CTA tile, its rows and columns, and their bounds."""

    tiling: RowTiling
    copy: cute.TiledCopy
    tidx: Int32
    tile: tuple  # (row tile, column tile) coordinate of this CTA
    cta_col: Int32  # rank along the row inside the cluster (0 without one)
    pred: cute.Tensor | None  # per-vector column-in-bounds flags; None when N tiles evenly
    tXcX: cute.Tensor  # (row, column) of each of the thread's values
    row: Int32  # global row of this thread
    row_ok: cutlass.Boolean  # row < M
    row_leader: cutlass.Boolean  # first thread of the row in the cluster's first CTA
    stage: Int32 | int = 0  # which reduction buffers this row tile uses (RowTiling.stages)
    phase: Int32 | int = 0  # the parity of this stage's mbarrier for this row tile
    # Issues the next row tile's loads (into the staging buffer, or registers); the tile's
    # first reduction runs it (through `ReductionScratch.at`), once its values are consumed.
    prefetch: Callable | None = None

    @property
    def tile_row(self) -> Int32:
        """This thread's row within its CTA's row tile (a staged tile's row index)."""
        return self.row - self.tile[0] * self.tiling.rows_per_cta

    @staticmethod
    def make(
        tiling: RowTiling,
        copy: cute.TiledCopy,
        mX: cute.Tensor,
        tidx: Int32,
        row_tile: Int32 | None = None,
        stage: Int32 | int = 0,
        phase: Int32 | int = 0,
        prefetch: Callable | None = None,
    ) -> RowContext:
        bidx, bidy, _ = cute.arch.block_idx()
        cta_col = bidy if tiling.cluster_n > 1 else Int32(0)
        tile = (bidx if row_tile is None else row_tile, cta_col)
        cX = cute.local_tile(cute.make_identity_tensor((mX.shape[0], tiling.n)), tiling.tiler_mn, tile)
        tXcX = copy.get_slice(tidx).partition_S(cX)
        pred = None if tiling.even_n else column_predicate(tXcX, tiling.n)
        row = tXcX[0][0]
        first = (tidx % tiling.threads_per_row == 0) & (cta_col == 0)
        ok = row < mX.shape[0]
        return RowContext(tiling, copy, tidx, tile, cta_col, pred, tXcX, row, ok, first, stage, phase, prefetch)


@cute.jit
def load_row(
    ctx: RowContext,
    mX: cute.Tensor,
    sX: cute.Tensor | None,
    fill: cutlass.Constexpr[float],
    while_in_flight: cutlass.Constexpr = None,
    scalars_first: cutlass.Constexpr[bool] = False,
) -> cute.Tensor:
    """This thread's slice of its row, in registers; columns past N read as `fill` (the
    reduction's identity), rows past M are left unread. `while_in_flight()` runs after the
    row's loads are issued and before they are waited on: scalar loads placed there (a
    cross-entropy row's target index) overlap the row instead of delaying it. With
    `scalars_first` it runs before the row's loads are issued, so that a cp.async it issues
    joins the row's commit group and the row's one wait covers it."""
    if const_expr(scalars_first and while_in_flight is not None):
        while_in_flight()
    if const_expr(sX is not None):
        # Stage through shared memory: cp.async keeps every load of the row in flight at
        # once without holding registers for them.
        copy_row_async(ctx, mX, sX)
        if const_expr(not scalars_first and while_in_flight is not None):
            while_in_flight()
        cute.arch.cp_async_wait_group(0)
        return read_staged_row(ctx, sX, fill)
    tXrX = cute.make_rmem_tensor_like(row_partition(ctx, mX))
    load_row_into(ctx, mX, tXrX, fill)
    if const_expr(not scalars_first and while_in_flight is not None):
        while_in_flight()
    return tXrX


def row_partition(ctx: RowContext, mX: cute.Tensor) -> cute.Tensor:
    return ctx.copy.get_slice(ctx.tidx).partition_S(cute.local_tile(mX, ctx.tiling.tiler_mn, ctx.tile))


@cute.jit
def load_row_into(ctx: RowContext, mX: cute.Tensor, tXrX: cute.Tensor, fill: cutlass.Constexpr[float]):
    """Issue the loads of this thread's row slice into registers `tXrX` (not waited on:
    the first use of a register waits for its load)."""
    t = ctx.tiling
    if const_expr(not t.even_n):
        tXrX.fill(fill)
    if ctx.row_ok:
        cute.copy(copy_atom(mX.element_type, t.vec), row_partition(ctx, mX), tXrX, pred=ctx.pred)


def chunk_of(t: cute.Tensor, chunks: int, c: int | None) -> cute.Tensor:
    """Chunk `c` of `chunks` of a thread's row partition ((vec, 1), rows, K): a view of its vectors
    c K / chunks to (c + 1) K / chunks - 1 (the whole partition where `c` is None)."""
    if c is None or chunks == 1:
        return t
    split = cute.logical_divide(t.layout, (None, None, cute.size(t, mode=[2]) // chunks))
    return cute.make_tensor(t.iterator, split)[None, None, (None, c)]


def fitting_chunks(tiling: RowTiling, chunks: int) -> int:
    """The most chunks, up to `chunks` (a power of two), a thread's row partition splits into
    (`chunk_of`): whole vectors each, and none where the row has padding columns (a chunk takes
    no column predicates)."""
    if chunks < 1 or chunks & (chunks - 1):
        raise ValueError(f"chunks={chunks} must be a power of two")
    if not tiling.even_n:
        return 1
    vectors = tiling.values_per_thread // tiling.vec
    while vectors % chunks:
        chunks //= 2
    return chunks


@cute.jit
def copy_row_async(ctx: RowContext, mX: cute.Tensor, sX: cute.Tensor, chunks: int = 1, c: int | None = None):
    """cp.async this thread's slice of its row (or chunk `c` of it, see `chunk_of`) into `sX`, as
    one commit group (committed even when the row is past M, so that group counts stay uniform)."""
    t = ctx.tiling
    thr = ctx.copy.get_slice(ctx.tidx)
    tXgX = chunk_of(thr.partition_S(cute.local_tile(mX, t.tiler_mn, ctx.tile)), chunks, c)
    tXsX = chunk_of(thr.partition_D(sX), chunks, c)
    if ctx.row_ok:
        cute.copy(copy_atom(mX.element_type, t.vec, is_async=True), tXgX, tXsX, pred=ctx.pred)
    cute.arch.cp_async_commit_group()


@cute.jit
def read_staged_row(
    ctx: RowContext, sX: cute.Tensor, fill: cutlass.Constexpr[float], chunks: int = 1, c: int | None = None
) -> cute.Tensor:
    """The thread's staged slice (or chunk `c` of it) in registers, once its copy group has been
    waited on; each thread reads only what its own cp.async wrote, so no barrier is needed."""
    t = ctx.tiling
    tXsX = chunk_of(ctx.copy.get_slice(ctx.tidx).partition_D(sX), chunks, c)
    if const_expr(not t.even_n):
        # a predicated-off cp.async still zero-fills its destination
        tXrFill = cute.make_rmem_tensor_like(tXsX[(None, 0), None, 0])
        tXrFill.fill(fill)
        for v in cutlass.range_constexpr(cute.size(tXsX, mode=[0, 1])):
            for k in cutlass.range_constexpr(cute.size(tXsX, mode=[2])):
                if not ctx.pred[v, 0, k]:
                    cute.autovec_copy(tXrFill, tXsX[(None, v), None, k])
    tXrX = cute.make_rmem_tensor_like(tXsX)
    cute.autovec_copy(tXsX, tXrX)
    return tXrX


@cute.jit
def widen(tXrX: cute.Tensor, bits: cutlass.Constexpr[bool] = False) -> cute.TensorSSA:
    """A register slice's values in fp32. With `bits`, each 32-bit pair of bf16 values becomes two
    fp32 by two bit operations (the low value shifted up 16, the high one masked), where
    cvt.f32.bf16 on each half is three instructions a pair in SASS (PRMT, then two shifts)."""
    pairs = const_expr(tXrX.element_type is cutlass.BFloat16 and cute.size(tXrX, mode=[0]) % 2 == 0)
    if const_expr(not (pairs and bits)):
        return tXrX.load().to(Float32)
    # compact copies (a register slice may keep its source's strides): in both, value i of the
    # slice is element i, so word k of the bf16 one holds what words 2k and 2k + 1 of the fp32 one get
    narrow = cute.make_rmem_tensor(tXrX.shape, tXrX.element_type)
    narrow.store(tXrX.load())
    wide = cute.make_rmem_tensor(tXrX.shape, Float32)
    pairs_in, words_out = cute.recast_tensor(narrow, cutlass.Uint32), cute.recast_tensor(wide, cutlass.Uint32)
    for k in cutlass.range_constexpr(cute.size(pairs_in)):
        word = pairs_in[k]
        words_out[2 * k] = word << cutlass.Uint32(16)
        words_out[2 * k + 1] = word & cutlass.Uint32(0xFFFF0000)
    return wide.load()


@cute.jit
def for_each_row(
    tiling: cutlass.Constexpr,
    copy: cute.TiledCopy,
    mX: cute.Tensor,
    sX: cute.Tensor | None,
    tidx: Int32,
    fill: cutlass.Constexpr[float],
    body: cutlass.Constexpr,
    while_in_flight: cutlass.Constexpr = None,
    scalars_first: cutlass.Constexpr[bool] = False,
):
    """`body(ctx, tXrX)` for each row tile of this CTA, with its row slice in registers
    (`load_row`'s; `while_in_flight(ctx)` and `scalars_first` as there, the latter with
    `row_loop` 1 alone). With `row_loop` > 1 the tiles are grid-strided and each takes the
    reduction stage and barrier phase of its parity; the body must take its reduction
    scratch `.at(ctx)` and run its reductions unconditionally
    (they synchronise the row anyway). A staged tile's successor is copied in from the
    body's first reduction on, so its loads overlap the reduction wait and the writes; with
    `prefetch_registers`, an unstaged one's is loaded into a second set of registers then.
    (`while_in_flight` then runs as the tile's turn begins, its loads issued a turn earlier.)"""
    if const_expr(tiling.row_loop == 1):
        ctx = RowContext.make(tiling, copy, mX, tidx)
        body(ctx, load_row(ctx, mX, sX, fill, _bound(while_in_flight, ctx), scalars_first))
    else:
        bidx, _, _ = cute.arch.block_idx()
        grid_m, _, _ = cute.arch.grid_dim()
        # Issues a row tile's loads ahead of its turn: into the staging buffer, or into
        # registers (`tXrNext`); None: each tile loads when its turn comes.
        issue = None
        if const_expr(sX is not None):
            issue = functools.partial(_copy_tile, tiling, copy, mX, sX, tidx)
        elif const_expr(tiling.prefetch_registers):
            tXrNext = cute.make_rmem_tensor_like(row_partition(RowContext.make(tiling, copy, mX, tidx, bidx), mX))
            issue = functools.partial(_load_tile, tiling, copy, mX, tXrNext, tidx, fill)
        if const_expr(issue is not None):
            issue(bidx)
        if const_expr(tiling.cluster_n > 1):
            cute.arch.cluster_wait()  # every peer's barriers are armed (init_cluster_barriers)
        for i in cutlass.range(tiling.row_loop, unroll=1):
            tile = bidx + i * grid_m
            if const_expr(issue is None):
                ctx = RowContext.make(tiling, copy, mX, tidx, tile, i % 2, (i // 2) % 2)
                body(ctx, load_row(ctx, mX, None, fill, _bound(while_in_flight, ctx)))
            else:
                # past the last tile the row is past M and nothing is loaded
                prefetch = _Once(functools.partial(issue, tile + grid_m))
                ctx = RowContext.make(tiling, copy, mX, tidx, tile, i % 2, (i // 2) % 2, prefetch)
                if const_expr(while_in_flight is not None):
                    while_in_flight(ctx)
                if const_expr(sX is not None):
                    cute.arch.cp_async_wait_group(0)
                    tXrX = read_staged_row(ctx, sX, fill)
                else:
                    # the tile's values move out of `tXrNext` before the body runs, so that
                    # its first reduction may load the successor into it
                    tXrX = cute.make_rmem_tensor_like(tXrNext)
                    tXrX.store(tXrNext.load())
                body(ctx, tXrX)
                prefetch()  # (a body without reductions)


# (a tile's context is made where its loads are issued, not held in registers till then)
def _load_tile(
    tiling: RowTiling, copy: cute.TiledCopy, mX: cute.Tensor, tXrX: cute.Tensor, tidx: Int32, fill: float, tile: Int32
):
    load_row_into(RowContext.make(tiling, copy, mX, tidx, tile), mX, tXrX, fill)


def _copy_tile(tiling: RowTiling, copy: cute.TiledCopy, mX: cute.Tensor, sX: cute.Tensor, tidx: Int32, tile: Int32):
    copy_row_async(RowContext.make(tiling, copy, mX, tidx, tile), mX, sX)


class _Once:
    """A trace-time call made at most once: the first of a tile's reductions to reach it
    emits it, later ones (a two-pass softmax's second) emit nothing."""

    def __init__(self, fn: Callable) -> None:
        self.fn, self.done = fn, False

    def __call__(self) -> None:
        if not self.done:
            self.done = True
            self.fn()


def _bound(fn: Callable | None, ctx: RowContext) -> Callable | None:
    return None if fn is None else functools.partial(fn, ctx=ctx)


@cute.jit
def store_row(ctx: RowContext, values: cute.TensorSSA, mO: cute.Tensor, chunks: int = 1, c: int | None = None):
    """Convert `values` (in the thread's partition order) to mO's type and write its row (or
    chunk `c` of it, see `chunk_of`)."""
    t = ctx.tiling
    tXgO = chunk_of(ctx.copy.get_slice(ctx.tidx).partition_D(cute.local_tile(mO, t.tiler_mn, ctx.tile)), chunks, c)
    tXrO = cute.make_rmem_tensor_like(tXgO)
    tXrO.store(values.to(tXrO.element_type))
    if ctx.row_ok:
        cute.copy(copy_atom(mO.element_type, t.vec), tXrO, tXgO, pred=ctx.pred)


@cute.jit
def load_columns(ctx: RowContext, mV: cute.Tensor, chunks: int = 1, c: int | None = None) -> cute.Tensor:
    """A per-column vector (a norm's weight or bias, shape (N,)) in the same partition as
    the row (or chunk `c` of it), so that it lines up element for element with `load_row`'s
    registers."""
    t = ctx.tiling
    # (the vector viewed as a tile of identical rows, row stride 0)
    tXgV = chunk_of(_column_partition(ctx, mV), chunks, c)
    tXrV = cute.make_rmem_tensor_like(tXgV)
    if const_expr(not t.even_n):
        tXrV.fill(0.0)
    cute.copy(copy_atom(mV.element_type, t.vec), tXgV, tXrV, pred=ctx.pred)
    return tXrV


def _column_partition(ctx: RowContext, mV: cute.Tensor) -> cute.Tensor:
    t = ctx.tiling
    mV2 = cute.make_tensor(mV.iterator, cute.make_layout((t.rows_per_cta, t.n), stride=(0, 1)))
    return ctx.copy.get_slice(ctx.tidx).partition_S(cute.local_tile(mV2, t.tiler_mn, (0, ctx.cta_col)))


@cute.jit
def _stage_columns(ctx: RowContext, mV: cute.Tensor, sV: cute.Tensor):
    """cp.async this CTA's slice of `mV` into `sV`: the threads of the CTA's first row cover
    it, since every row of the CTA needs the same columns."""
    if ctx.tidx < ctx.tiling.threads_per_row:
        cute.copy(copy_atom(mV.element_type, ctx.tiling.vec, is_async=True), _column_partition(ctx, mV), sV,
                  pred=ctx.pred)  # fmt: skip


# Plain (traced) helpers rather than @cute.jit: they loop over a Python tuple of vectors.
def columns_begin(ctx: RowContext, smem: cutlass.memory.SmemAllocator, mode: str, vectors: tuple) -> tuple:
    """Start loading per-column vectors as RowKnobs.columns says; call before load_row."""
    if mode == "early":
        return tuple(load_columns(ctx, v) for v in vectors)
    if mode == "late":
        return ()
    t = ctx.tiling
    # One copy of the CTA's column slice, seen by every row (row stride 0): with several
    # rows a CTA, each vector crosses L2 once per CTA instead of once per row.
    broadcast = cute.make_layout(t.tiler_mn, stride=(0, 1))
    staged = []
    for v in vectors:
        sV = smem.allocate_tensor(v.element_type, cute.make_layout(t.cols_per_cta), 16)
        tXsV = ctx.copy.get_slice(ctx.tidx).partition_D(cute.make_tensor(sV.iterator, broadcast))
        _stage_columns(ctx, v, tXsV)
        staged.append(tXsV)
    cute.arch.cp_async_commit_group()
    return tuple(staged)


def columns_end(ctx: RowContext, mode: str, vectors: tuple, begun: tuple) -> tuple:
    """The vectors in registers, in the row's partition; call after the reduction."""
    if mode == "early":
        return begun
    if mode == "late":
        return tuple(load_columns(ctx, v) for v in vectors)
    t = ctx.tiling
    if const_expr(not (t.row_loop > 1 and t.stage_smem)):
        # (a looping staged row waited for every group before its first reduction, the
        # columns' among them; only its successor's may be in flight now)
        cute.arch.cp_async_wait_group(0)
    if const_expr(t.rows_per_cta > 1):
        cute.arch.barrier()  # the first row's threads wrote what every row reads
    out = []
    for tXsV in begun:
        tXrV = cute.make_rmem_tensor_like(tXsV)
        cute.autovec_copy(tXsV, tXrV)
        out.append(tXrV)
    return tuple(out)


@cute.jit
def zero_padding(ctx: RowContext, values: cute.TensorSSA) -> cute.TensorSSA:
    """`values` (in the thread's partition order) with the padding columns past N set to 0."""
    thr = ctx.copy.get_slice(ctx.tidx)
    tXr = cute.make_rmem_tensor(thr.partition_S(cute.make_identity_tensor(ctx.tiling.tiler_mn)).shape, Float32)
    tXr.store(values)
    zeros = cute.make_rmem_tensor_like(tXr[(None, 0), None, 0])
    zeros.fill(0.0)
    for v in cutlass.range_constexpr(cute.size(tXr, mode=[0, 1])):
        for k in cutlass.range_constexpr(cute.size(tXr, mode=[2])):
            if not ctx.pred[v, 0, k]:
                cute.autovec_copy(zeros, tXr[(None, v), None, k])
    return tXr.load()


@cute.jit
def value_at_column(ctx: RowContext, tXrX: cute.Tensor, col: Int32) -> tuple:
    """(holds, x): whether this thread holds column `col` of its row, and if so its value
    there (fp32). Exactly one thread of the row holds a column in [0, N); the test is a few
    integer operations from the copy's layout (vectors of `vec` columns, `vec *
    threads_per_row` apart), and only the holder selects among its values."""
    t, tXcX = ctx.tiling, ctx.tXcX
    stride = const_expr(t.vec * t.threads_per_row)
    d = col - tXcX[0][1]
    holds = (d >= 0) & (d < t.values_per_thread // t.vec * stride) & (d % stride < t.vec) & (col < t.n)
    val = cute.make_rmem_tensor(1, Float32)
    val[0] = Float32(0.0)
    if holds:
        for i in cutlass.range_constexpr(cute.size(tXrX)):
            if tXcX[i][1] == col:
                val[0] = Float32(tXrX[i])
    return holds, val[0]


@cute.jit
def valid_count(ctx: RowContext) -> Float32:
    """How many of this thread's values lie inside the row (padding excluded)."""
    t = ctx.tiling
    count = Float32(t.values_per_thread)
    if const_expr(not t.even_n):
        count = Float32(0.0)
        for v in cutlass.range_constexpr(cute.size(ctx.pred, mode=[0])):
            for k in cutlass.range_constexpr(cute.size(ctx.pred, mode=[2])):
                count += Float32(t.vec) * Float32(cutlass.select_(ctx.pred[v, 0, k], Float32(1.0), Float32(0.0)))
    return count
