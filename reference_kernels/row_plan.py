"""The row template's host side, plain Python evaluated at trace time: the knobs a search may
vary (`RowKnobs`), what they resolve to for one (dtype width, N) (`RowTiling`), and the limit
tables they fall back on (reference_kernels.tuning.rows).

A row of N elements is split over `threads_per_row` threads of a CTA and, for long rows, over
the `cluster_n` CTAs of a thread-block cluster; each thread keeps its slice of the row in
registers, loaded with vectors of up to 128 bits.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from reference_kernels.tuning import rows as T

WARP = 32
MAX_CLUSTER = 16  # Hopper's portable limit is 8; 16 needs the non-portable opt-in (sm_90a has it)
MAX_N = 262144 * 2  # beyond this a CTA's slice no longer fits in registers at cluster 16


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
    # global memory. None: T.DEPENDENT_LAUNCH by N.
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
    threads_per_row_table: tuple[tuple[int | None, int], ...] = T.THREADS_PER_ROW,
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
    threads = knobs.num_threads or max(pick(T.NUM_THREADS, n), tpr)
    table = T.CLUSTER_N_16BIT if width_bits <= 16 else T.CLUSTER_N_32BIT
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
    dependent = pick(T.DEPENDENT_LAUNCH, n) if knobs.dependent_launch is None else knobs.dependent_launch
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
    threads_per_row_table: tuple[tuple[int | None, int], ...] = T.THREADS_PER_ROW,
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
