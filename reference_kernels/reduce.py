"""The row-reduction template every reference kernel is built on.

A row of N elements is split over `threads_per_row` threads of a CTA and, for long rows,
over the `cluster_n` CTAs of a thread-block cluster. Each thread keeps its slice of the row
in registers (loaded with 128-bit vectors, optionally staged through shared memory by
cp.async), so the row is read from HBM exactly once and written once. A reduction then
climbs four levels:

    registers (per thread)  ->  warp (shuffle butterfly)  ->  block (shared memory)
        ->  cluster (st.async into each peer's shared memory, completing on an mbarrier)

Reductions are over *tuples* with a user `combine`, so a fused (max, sum-of-exp) pair for
softmax costs one trip through each level, not two.

Host-side pieces (`RowKnobs`, `RowTiling`, the limit tables) are plain Python evaluated at
trace time; device pieces are `@cute.jit` functions inlined into each op's kernel.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import cpasync
from cutlass.cutlass_dsl import dsl_user_op

WARP = 32
MAX_CLUSTER = 16  # Hopper's portable limit is 8; 16 needs the non-portable opt-in (sm_90a has it)

# Limit tables: the first row whose limit is >= N wins; None means "and above".
# Threads cooperating on one row: enough that each holds at most ~64 values of the row.
THREADS_PER_ROW: tuple[tuple[int | None, int], ...] = (
    (64, 8),
    (128, 16),
    (3072, 32),
    (6144, 64),
    (16384, 128),
    (None, 256),
)
# Threads per CTA: 128 keeps more CTAs resident for short rows; 256 for long ones.
NUM_THREADS: tuple[tuple[int | None, int], ...] = ((16384, 128), (None, 256))
# CTAs per row (cluster size), by N for 16-bit and for 32-bit elements: the row slice a CTA
# holds stays <= 16K elements (<= 64 fp32 registers a thread at 256 threads).
CLUSTER_N_16BIT: tuple[tuple[int | None, int], ...] = (
    (16384, 1),
    (32768, 2),
    (65536, 4),
    (131072, 8),
    (None, 16),
)
CLUSTER_N_32BIT: tuple[tuple[int | None, int], ...] = (
    (16384, 1),
    (32768, 2),
    (65536, 4),
    (131072, 8),
    (None, 16),
)
MAX_N = 262144 * 2  # beyond this a CTA's slice no longer fits in registers at cluster 16
# Launch as a programmatic dependent (RowKnobs.dependent_launch): without CUDA graphs the next
# kernel's launch is processed while this one ends, not after. Measurements: docs/tuning.md,
# reduce.DEPENDENT_LAUNCH.
DEPENDENT_LAUNCH: tuple[tuple[int | None, bool], ...] = ((None, True),)


def pick(table: tuple[tuple[int | None, int], ...], n: int) -> int:
    for limit, value in table:
        if limit is None or n <= limit:
            return value
    raise AssertionError("limit table must end with a None row")


def pick_mode(name: str, table: tuple[tuple[int | None, str], ...], n: int, modes: tuple[str, ...]) -> str:
    """The mode a table of modes named `name` picks at N, one of `modes` (a sweep may put
    anything there)."""
    mode = pick(table, n)
    if mode not in modes:
        raise ValueError(f"{name}: {mode!r} is none of {', '.join(modes)}")
    return mode


@dataclass(frozen=True)
class RowKnobs:
    """Tuning knobs a search may vary; None means 'take the limit table's value'."""

    threads_per_row: int | None = None
    num_threads: int | None = None
    cluster_n: int | None = None
    vec_bits: int = 128  # widest vector a thread moves at once
    # cp.async global->shared->registers, or direct vector loads; None: stage short rows
    # (cluster_n == 1) only, since for clustered long rows the shared-memory footprint
    # costs more residency than the staging gains (measured on H100: 2.78 vs 2.98 TB/s)
    stage_smem: bool | None = None
    online: bool = True  # one fused reduction of (max, sum) instead of two passes
    # Per-column vectors (a norm's weight, bias): "early" into registers before the row's
    # reduction (their latency hides there, but they hold registers throughout); "late" into
    # registers after it (only the row is live while it is reduced, so a long row keeps a
    # plain row op's tiling and residency); "smem": cp.async into shared memory before, read
    # back after (early's latency hiding at late's register cost; one copy per CTA, shared
    # by its rows, so more rows a CTA means fewer trips through L2). None: the op's table.
    columns: str | None = None
    # Row tiles one CTA handles in turn (grid-strided). Above 1, per-column vectors are
    # loaded once for all of them (a long row's weight is re-read from L2 per row, not once
    # per CTA), and a staged row's successor is copied in while the current one is reduced
    # and written.
    # None: the op's table, else 1.
    row_loop: int | None = None
    # Looping unstaged: load the next row tile into a second set of registers from the
    # current tile's first reduction on, so that its loads overlap the reduction wait and
    # the writes (at the cost of the registers of a row slice in its storage type; ignored
    # when staged or not looping). None: the op's table, else False.
    prefetch_registers: bool | None = None
    # CTAs one SM must hold: ptxas then keeps registers within 65536 / (this * threads),
    # spilling if it must (None: as many registers as the code wants)
    min_ctas_per_sm: int | None = None
    # Launched as a programmatic dependent (PDL): the launch may begin before the stream's
    # previous kernel has ended, and the kernel waits for that grid before it touches
    # global memory. None: DEPENDENT_LAUNCH by N.
    dependent_launch: bool | None = None


@dataclass(frozen=True)
class RowTiling:
    """Knobs resolved for one (dtype width, N): everything the kernel's shape depends on."""

    n: int
    vec: int  # elements per vector access
    threads_per_row: int
    num_threads: int
    cluster_n: int
    stage_smem: bool
    row_loop: int = 1
    min_ctas_per_sm: int | None = None
    prefetch_registers: bool = False
    dependent_launch: bool = False

    @property
    def stages(self) -> int:
        """Reduction buffers and barriers: two when looping, so that a fast peer's partials
        for the next row tile never land on ones still being read. (A staged row needs one
        buffer whatever the loop: each thread refills only the slots it has read.)"""
        return 2 if self.row_loop > 1 else 1

    @property
    def rows_per_cta(self) -> int:
        return self.num_threads // self.threads_per_row

    @property
    def cols_per_cta(self) -> int:
        per_cta = math.ceil(self.n / self.cluster_n)
        return self.vec * self.threads_per_row * math.ceil(per_cta / (self.vec * self.threads_per_row))

    @property
    def tiler_mn(self) -> tuple[int, int]:
        return (self.rows_per_cta, self.cols_per_cta)

    @property
    def warps_per_row(self) -> int:
        return max(self.threads_per_row // WARP, 1)

    @property
    def values_per_thread(self) -> int:
        return self.cols_per_cta // self.threads_per_row

    @property
    def even_n(self) -> bool:
        return self.cols_per_cta * self.cluster_n == self.n


# fp32 values of row-shaped arrays (x, a weight, a bias) a thread may hold in registers
# before ptxas starts spilling (255 registers, less the addressing and reduction state).
REGISTER_VALUES = 128


def vector_elems(vec_bits: int, widest_bits: int, n: int) -> int:
    """Elements a vector access moves: as many as `vec_bits` allows for the widest tensor,
    while a run of `n` elements (a row, a leading index's slab) starts vector-aligned, which
    needs the vector to divide n; ValueError on a vec_bits no access can have."""
    if vec_bits not in (16, 32, 64, 128) or vec_bits < widest_bits:
        raise ValueError(f"vec_bits={vec_bits} must be 16, 32, 64 or 128 and >= {widest_bits}")
    return math.gcd(n, vec_bits // widest_bits)


def resolve_tiling(
    knobs: RowKnobs,
    width_bits: int,
    n: int,
    widest_bits: int | None = None,
    arrays: int = 1,
    threads_per_row_table: tuple[tuple[int | None, int], ...] = THREADS_PER_ROW,
) -> RowTiling:
    """Resolve knobs for rows of `n` elements of `width_bits`; raise ValueError on bad knobs.

    `widest_bits` is the widest element among the tensors moved with the same layout (an fp32
    output beside a bf16 input), since one vector must be <= 128 bits for each of them.
    `arrays` is how many row-shaped arrays a thread keeps in registers at once; where the
    tables leave a thread more than REGISTER_VALUES values, the row is spread over more CTAs,
    then more threads (knobs given explicitly are kept as given).
    """
    if not 1 <= n <= MAX_N:
        raise ValueError(f"N={n} is outside the supported range 1..{MAX_N}")
    widest = max(width_bits, widest_bits or 0)
    vec = vector_elems(knobs.vec_bits, widest, n)
    tpr = knobs.threads_per_row or pick(threads_per_row_table, n)
    threads = knobs.num_threads or max(pick(NUM_THREADS, n), tpr)
    table = CLUSTER_N_16BIT if width_bits <= 16 else CLUSTER_N_32BIT
    cluster = knobs.cluster_n or pick(table, n)
    if tpr & (tpr - 1) or not 1 <= tpr <= 1024:
        raise ValueError(f"threads_per_row={tpr} must be a power of two <= 1024")
    if threads % WARP or threads % tpr or not WARP <= threads <= 1024:
        raise ValueError(f"num_threads={threads} must be a multiple of 32 and of threads_per_row, <= 1024")
    if tpr > WARP and tpr % WARP:
        raise ValueError(f"threads_per_row={tpr} above a warp must be whole warps")
    if cluster & (cluster - 1) or not 1 <= cluster <= MAX_CLUSTER:
        raise ValueError(f"cluster_n={cluster} must be a power of two <= {MAX_CLUSTER}")
    row_loop = knobs.row_loop or 1
    if knobs.row_loop is not None and not 1 <= knobs.row_loop <= 1024:
        raise ValueError(f"row_loop={knobs.row_loop} must be 1..1024")
    if knobs.min_ctas_per_sm is not None and not 1 <= knobs.min_ctas_per_sm * threads <= 2048:
        raise ValueError(f"min_ctas_per_sm={knobs.min_ctas_per_sm} CTAs of {threads} threads exceed an SM's 2048")

    def per_thread(tpr: int, cluster: int) -> int:
        return math.ceil(n / (vec * tpr * cluster)) * vec

    while per_thread(tpr, cluster) * arrays > REGISTER_VALUES:
        if knobs.cluster_n is None and cluster < MAX_CLUSTER:
            cluster *= 2
        elif knobs.threads_per_row is None and knobs.num_threads is None and tpr < 1024:
            tpr *= 2
            threads = max(threads, tpr)
        else:
            break
    # Shrink the cluster until every CTA owns part of the row: an empty peer would still
    # have to join every cluster reduction for nothing.
    while cluster > 1 and math.ceil(n / (vec * tpr * cluster)) * vec * tpr * (cluster - 1) >= n:
        cluster //= 2
    # cp.async moves 4, 8 or 16 bytes: narrower vectors (16-bit scalars) load directly
    stage = knobs.stage_smem if knobs.stage_smem is not None else cluster == 1
    staged = stage and vec * width_bits >= 32
    prefetch = bool(knobs.prefetch_registers) and row_loop > 1 and not staged
    dependent = pick(DEPENDENT_LAUNCH, n) if knobs.dependent_launch is None else knobs.dependent_launch
    tiling = RowTiling(n, vec, tpr, threads, cluster, staged, row_loop, knobs.min_ctas_per_sm, prefetch, dependent)
    if tiling.values_per_thread > 256:
        raise ValueError(
            f"N={n} needs {tiling.values_per_thread} values per thread with these knobs "
            f"(limit 256): raise threads_per_row or cluster_n"
        )
    return tiling


COLUMN_MODES = ("early", "late", "smem")


def fill_knobs(knobs: RowKnobs, table: tuple[tuple[int | None, dict], ...], n: int) -> RowKnobs:
    """`knobs` with the fields it leaves None taken from an op's limit table of knob sets,
    for knobs that only pay together (a long row's loop, its tiling, how it stages). So a
    set is taken whole or not at all: where `knobs` gives one of its fields another value,
    none of it applies (a tiling tuned for weights in shared memory would spill with them
    in registers)."""
    row = pick(table, n)  # type: ignore[arg-type]
    if any(getattr(knobs, k) not in (None, v) for k, v in row.items()):
        return knobs
    return dataclasses.replace(knobs, **{k: v for k, v in row.items() if getattr(knobs, k) is None})


def resolve_with_columns(
    knobs: RowKnobs,
    width_bits: int,
    n: int,
    widest_bits: int,
    columns: int,
    table: tuple[tuple[int | None, str], ...],
    threads_per_row_table: tuple[tuple[int | None, int], ...] = THREADS_PER_ROW,
) -> tuple[RowTiling, str]:
    """The tiling for an op holding `columns` per-column vectors beside the row, and how it
    loads them (RowKnobs.columns, else the op's limit `table` by N). Early, each vector
    takes registers for the whole kernel, which the tiling pays for with more threads or
    CTAs per row; late and smem keep the tiling of the row alone."""
    mode = knobs.columns or pick(table, n)  # type: ignore[arg-type]
    if mode not in COLUMN_MODES:
        raise ValueError(f"columns={mode!r} must be one of {', '.join(COLUMN_MODES)}")
    arrays = 1 + columns if mode == "early" else 1
    tiling = resolve_tiling(knobs, width_bits, n, widest_bits, arrays, threads_per_row_table)
    return tiling, stageable_columns(mode, tiling, widest_bits)


def stageable_columns(mode: str, tiling: RowTiling, bits: int) -> str:
    """`mode`, or "late" where "smem" would stage vectors of `bits`-wide elements too narrow
    for cp.async (it moves 4, 8 or 16 bytes: an odd 16-bit N), which then load directly."""
    return "late" if mode == "smem" and tiling.vec * bits < 32 else mode


# --------------------------------------------------------------------------- copies


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
    mean = a[1] + delta * b[0] * inv
    m2 = a[2] + b[2] + delta * delta * a[0] * b[0] * inv
    return (n, mean, m2)


LOG2_E = math.log2(math.e)


def safe_max(m: Float32) -> Float32:
    """A max usable as an exponent offset: an all -inf group gives 0, not NaN."""
    return Float32(cutlass.select_(m == -Float32.inf, Float32(0.0), m))


def max_sumexp(a: tuple, b: tuple) -> tuple:
    """(m, s) pairs meaning s * exp(m): merge two such partial sums of exponentials."""
    m = cute.arch.fmax(a[0], b[0])
    mo = safe_max(m)
    s = a[1] * cute.math.exp2((a[0] - mo) * LOG2_E, fastmath=True) + b[1] * cute.math.exp2(
        (b[0] - mo) * LOG2_E, fastmath=True
    )
    return (m, s)


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
