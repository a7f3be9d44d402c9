"""RMSNorm backward over the last dimension, from the forward's saved rstd:
xhat = x * rstd, g = dy * w, dx = (g - xhat * mean(g * xhat)) * rstd, dw = sum over rows of dy * xhat.

Kernel contract entry: `launch(mdY, mX, mW, mRstd, mdX, mdW, mWork, stream)`; mdY, mX, mdX (M, N),
mW, mdW (N,), mRstd (M,) fp32, mWork the contract's fp32 workspace (WORKSPACE).
`layernorm_bwd` is the same kernel with the mean subtracted and db beside dw.

dw is a sum over every row: a grid of at most `cap` CTAs (a few per SM) loops over the row
tiles, each thread keeping its columns' share of dw in fp32 registers; a CTA folds its rows'
shares in shared memory and writes one partial row into the workspace, and a second kernel
sums those partial rows column by column in a fixed order. The same inputs give the same
bits on every run (no atomics).
"""

from __future__ import annotations

import dataclasses
import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from reference_kernels import reduce as R
from reference_kernels.tuning import rmsnorm_bwd as T

OP = "rmsnorm_bwd"
# Partial rows for dw (and db) in fp32: 32 MiB. At N = 262144 that is 16 rows for RMSNorm
# (8 with LayerNorm's db), past the CTAs a cluster of 16 can keep resident anyway.
WORKSPACE = 1 << 23


class NormBackward:
    # dy is one value everywhere, read from a (1,) tensor (the *_bwd_scalar ops, below): the
    # upstream gradient of `.sum()`, expanded, which the rows kernel needs made dense first
    one_dy = False

    def __init__(self, knobs: R.RowKnobs = R.RowKnobs(), bias: bool = False) -> None:
        self.knobs = knobs
        self.bias = bias  # LayerNorm: subtract the mean, and write db

    @cute.jit
    def __call__(
        self,
        mdY: cute.Tensor,
        mX: cute.Tensor,
        mW: cute.Tensor,
        mRstd: cute.Tensor,
        mdX: cute.Tensor,
        mdW: cute.Tensor,
        mWork: cute.Tensor,
        stream,
    ):
        # (no mean, no db: mRstd and mdW stand in for them, never read or written as such)
        self._launch(mdY, mX, mW, mRstd, mRstd, mdX, mdW, mdW, mWork, stream)

    def _launch(self, mdY, mX, mW, mMean, mRstd, mdX, mdW, mdB, mWork, stream) -> None:
        n = mX.shape[1]
        widest = max(mdY.element_type.width, mX.element_type.width, mW.element_type.width, mdX.element_type.width)
        # Rows are staged in shared memory (cp.async) and read twice, so what a thread holds
        # across the reduction is w and the fp32 column sums. The loop over row tiles is
        # grid-strided and dynamic (row_loop > 1 gives each tile's reduction its own stage,
        # see `RowTiling.stages`).
        knobs = self.knobs
        # Every CTA loops over several row tiles whatever row_loop says, so the row reduction
        # needs its two stages: with one, a cluster peer already on the next tile sends its
        # partials into the buffer (and onto the barrier) of this one (H100, row_loop=1 at
        # cluster 2-4: "unspecified launch failure", evals/results/h100-2026-11-24).
        if knobs.row_loop is None or knobs.row_loop < 2:
            knobs = dataclasses.replace(knobs, row_loop=2)
        widths = (mX.element_type.width, mdY.element_type.width, mW.element_type.width)
        knobs = R.fill_knobs(knobs, self.knobs_16bit() if widths[0] <= 16 else self.knobs_32bit(), n)
        if knobs.stage_smem is None:
            knobs = dataclasses.replace(knobs, stage_smem=widths[0] > 16 or R.pick(self.stage_16bit(), n) == 1)
        self.tiling, self.weight_in, self.depth = self.plan(knobs, n, widths, widest)
        t = self.tiling
        sends = T.CLUSTER_SEND if widths[0] <= 16 else T.CLUSTER_SEND_32BIT
        self.cta_first = R.pick_mode("CLUSTER_SEND", sends, n, ("warps", "cta")) == "cta"
        self.widen_bits = R.pick_mode("WIDEN_BF16", T.WIDEN_BF16, n, ("cvt", "bits")) == "bits"
        self.arithmetic = R.pick(self.arithmetic_table(widths[0]), n)
        if not set(self.arithmetic) <= {"dx", "xhat", "sums"}:
            raise ValueError(f"ARITHMETIC: {self.arithmetic!r} names a form other than dx, xhat, sums")
        arity = 2 if self.bias else 1
        need = self.shared_bytes(t, self.weight_in, widths, 3)
        need += R.scratch_bytes(t, arity, T.OVERLAP_STAGES, self.cta_first)
        room = T.SMEM_PER_CTA if self.cta_first else T.SMEM_BUDGET + R.scratch_bytes(t, arity)
        self.overlap = bool(R.pick(T.OVERLAP, n) and t.cluster_n > 1 and t.stage_smem and need <= room)
        if self.overlap:
            self.depth = max(self.depth, 3)
        held = t.stage_smem and not self.overlap
        self.second_read = R.pick_mode("SECOND_READ", T.SECOND_READ, n, ("smem", "registers")) if held else "smem"
        self.chunks = R.fitting_chunks(t, R.pick(T.TILE_CHUNKS, n)) if held and self.second_read == "smem" else 1
        # (one tile staged, read again from shared memory, whole; in one part, the refill before
        # dx lost everywhere it ran: T.REFILL_PARTS)
        refill = R.pick(T.REFILL_PARTS if widths[0] <= 16 else T.REFILL_PARTS_32BIT, n)
        refills = refill > 0 and held and self.depth == 1 and self.second_read == "smem" and self.chunks == 1
        self.refill_parts = R.fitting_chunks(t, refill) if refills else 1
        self.padded_n = t.cols_per_cta * t.cluster_n  # a partial row covers padding too: no predicates
        partials = 2 if self.bias else 1
        per_sm = R.pick(self.ctas_per_sm_table(widths[0]), n)
        self.cap = max(1, min(T.NUM_SMS * per_sm // t.cluster_n, WORKSPACE // (partials * self.padded_n)))
        at_once = R.pick(T.CLUSTERS_AT_ONCE, t.cluster_n)
        if at_once:
            self.cap = min(self.cap, at_once)
        copy = R.row_tiled_copy(mX.element_type, t)
        grid_m = cutlass.min(cute.ceil_div(mX.shape[0], t.rows_per_cta), Int32(self.cap))
        R.launch_kernel(
            self.kernel(mdY, mX, mW, mMean, mRstd, mdX, mWork, copy),
            t,
            stream,
            waits=True,
            grid=[grid_m, t.cluster_n, 1],
            block=[t.num_threads, 1, 1],
            cluster=[1, t.cluster_n, 1] if t.cluster_n > 1 else None,
        )
        self.finish_warps = min(T.MAX_FINISH_WARPS, 1 << (self.cap - 1).bit_length())
        sums = [(mdW, 0)] + ([(mdB, self.cap * self.padded_n)] if self.bias else [])
        for mOut, offset in sums:
            part = cute.make_tensor(mWork.iterator + offset, cute.make_layout(self.cap * self.padded_n))
            R.launch_kernel(
                self.finish(part, mOut, grid_m),
                t,
                stream,
                waits=True,
                grid=[math.ceil(n / R.WARP), 1, 1],
                block=[R.WARP * self.finish_warps, 1, 1],
            )

    @staticmethod
    def stage_16bit() -> tuple[tuple[int | None, int], ...]:
        """The op's table of which 16-bit rows are staged (read when traced: a sweep may swap it)."""
        return T.STAGE_16BIT

    @staticmethod
    def knobs_16bit() -> tuple[tuple[int | None, dict], ...]:
        """The op's knob sets for 16-bit rows, by N (read when traced)."""
        return T.KNOBS_16BIT

    @staticmethod
    def knobs_32bit() -> tuple[tuple[int | None, dict], ...]:
        """The op's knob sets for 32-bit rows, by N (read when traced)."""
        return ((None, {}),)

    @staticmethod
    def arithmetic_table(bits: int) -> tuple[tuple[int | None, tuple[str, ...]], ...]:
        """The op's table of arithmetic forms for rows of `bits`-wide x (read when traced)."""
        return T.ARITHMETIC_16BIT if bits <= 16 else T.ARITHMETIC_32BIT

    @staticmethod
    def ctas_per_sm_table(bits: int) -> tuple[tuple[int | None, int], ...]:
        """The op's table of row-tile CTAs a SM for rows of `bits`-wide x (read when traced)."""
        return T.CTAS_PER_SM if bits <= 16 else T.CTAS_PER_SM_32BIT

    def plan(
        self, knobs: R.RowKnobs, n: int, widths: tuple[int, int, int], widest: int
    ) -> tuple[R.RowTiling, str, int]:
        """The tiling, where w is read from and the staging depth, within T.SMEM_BUDGET (`widths`:
        x, dy, w bits)."""
        weight_in = self.knobs.columns or R.pick(T.WEIGHT_IN, n)
        wider = self.knobs.cluster_n is None
        while True:
            t = R.resolve_tiling(knobs, widths[0], n, widest, R.pick(T.ROW_ARRAYS, n), T.THREADS_PER_ROW)
            # (copied through registers into shared memory instead, dx came out NaN past the
            # first row on the H100)
            weight_in = R.stageable_columns(weight_in, t, widths[2])
            need = self.shared_bytes(t, weight_in, widths)
            wide = dataclasses.replace(knobs, cluster_n=min(2 * t.cluster_n, R.MAX_CLUSTER))
            # (resolve_tiling shrinks a cluster that would leave a CTA without columns)
            widens = wider and self._cluster(wide, n, widths, widest) > t.cluster_n
            if need <= T.SMEM_TWO_A_SM or (need <= T.SMEM_BUDGET and not widens):
                # the depth never changes the tiling, and is dropped where it does not fit
                depth = R.pick(T.STAGING_DEPTH if widths[0] <= 16 else T.STAGING_DEPTH_32BIT, n) if t.stage_smem else 1
                if self.shared_bytes(t, weight_in, widths, depth) > T.SMEM_BUDGET:
                    depth = 1
                return t, weight_in, depth  # type: ignore[return-value]
            if widens:
                knobs = wide
            elif weight_in == "smem" and self.knobs.columns is None:
                weight_in = "late"
            elif t.stage_smem and self.knobs.stage_smem is None:
                knobs = dataclasses.replace(knobs, stage_smem=False)
            else:
                raise ValueError(
                    f"N={n}: these knobs need {self.shared_bytes(t, weight_in, widths)} B of shared memory"
                )

    @staticmethod
    def _cluster(knobs: R.RowKnobs, n: int, widths: tuple[int, int, int], widest: int) -> int:
        return R.resolve_tiling(knobs, widths[0], n, widest, R.pick(T.ROW_ARRAYS, n), T.THREADS_PER_ROW).cluster_n

    def shared_bytes(self, t: R.RowTiling, weight_in: str, widths: tuple[int, int, int], depth: int = 1) -> int:
        """What `kernel` allocates in shared memory, less the scratch (see T.SMEM_BUDGET)."""
        tile = t.rows_per_cta * t.cols_per_cta
        sums = 2 if self.bias else 1
        total = tile * 4 * sums if t.rows_per_cta > 1 else 0
        if t.stage_smem:
            total += tile * (widths[0] + widths[1]) // 8 * depth
        if weight_in == "smem":
            total += t.cols_per_cta * widths[2] // 8
        return total

    @cute.kernel
    def kernel(
        self,
        mdY: cute.Tensor,
        mX: cute.Tensor,
        mW: cute.Tensor,
        mMean: cute.Tensor,
        mRstd: cute.Tensor,
        mdX: cute.Tensor,
        mWork: cute.Tensor,
        copy: cute.TiledCopy,
    ):
        t = self.tiling
        tidx, _, _ = cute.arch.thread_idx()
        R.await_previous_grid(t)
        bidx, _, _ = cute.arch.block_idx()
        grid_m, _, _ = cute.arch.grid_dim()
        smem = cutlass.memory.SmemAllocator()
        stages = T.OVERLAP_STAGES if const_expr(self.overlap) else t.stages
        scratch = R.allocate_scratch(smem, t, 2 if const_expr(self.bias) else 1, stages, self.cta_first)
        R.init_cluster_barriers((scratch,), t, tidx, stages)
        # one fp32 tile a column sum for folding a CTA's rows (with one row a CTA, none)
        sums = 2 if const_expr(self.bias) else 1
        sAcc = [None] * sums
        if const_expr(t.rows_per_cta > 1):
            layout = cute.make_ordered_layout(t.tiler_mn, order=(1, 0))
            sAcc = [smem.allocate_tensor(Float32, layout, byte_alignment=16) for _ in range(sums)]
        depth = self.depth
        sX = sdY = None
        if const_expr(t.stage_smem):
            sX = R.allocate_staging(smem, t, mX.element_type, depth)
            # (one value: dy's "staging" is that value's tensor; the plan still counts a buffer)
            sdY = mdY if const_expr(self.one_dy) else R.allocate_staging(smem, t, mdY.element_type, depth)
        first = R.RowContext.make(t, copy, mX, tidx, bidx)
        # w in registers for every tile ("early"), or staged once and read from shared memory
        # each tile ("smem"), or loaded from L2 each tile ("late")
        begun = R.columns_begin(first, smem, self.weight_in, (mW,))
        tXrW = begun[0] if const_expr(self.weight_in != "late") else None
        if const_expr(self.weight_in == "smem"):
            cute.arch.cp_async_wait_group(0)
            cute.arch.barrier()  # the first row's threads staged what every row reads
        shape = R.row_partition(first, mX).shape
        acc_w = cute.make_rmem_tensor(shape, Float32)
        acc_w.fill(0.0)
        acc_b = cute.make_rmem_tensor(shape, Float32)
        if const_expr(self.bias):
            acc_b.fill(0.0)
        if const_expr(t.cluster_n > 1):
            cute.arch.cluster_wait()  # every peer's barriers are armed

        tiles = cute.ceil_div(mX.shape[0], t.rows_per_cta)
        if const_expr(self.overlap):
            self.overlapped_rows(first, copy, tidx, tiles, (mX, mdY), (sX, sdY), mW, tXrW, mMean, mRstd, mdX,
                                 scratch, acc_w, acc_b)  # fmt: skip
        else:
            # A tile staged a whole tile ahead (depth 2) is ready as its turn begins: its rstd (and
            # mean), loaded only then, made each tile wait one memory latency more. They are loaded
            # a tile ahead too. A depth-1 tile's copy is issued at the end of the tile before, and its
            # scalars' latency hides behind it; rows held in registers load in their own turn and
            # take the scalars ahead as well (rmsnorm bf16 32768x8192: 2.722, QuACK 2.718).
            # H100, TB/s ahead / in the tile's turn (QuACK) (evals/results/h100-2026-11-24e,
            # ahead.txt): layernorm bf16 32768x8192 2.893 / 2.641 (2.655), 16384x16384 2.824 / 2.490
            # (2.477), 4096x65536 2.214 / 1.927 (1.898), fp32 4096x65536 2.726 / 2.559 (2.651);
            # rmsnorm bf16 4096x65536 2.616 / 2.500 (2.159); fp32 depth 1, layernorm 16384 2.880 /
            # 2.897.
            # (a buffer freed once read: each tile's copy goes out a reduction earlier, see T.SECOND_READ)
            early = const_expr(self.second_read == "registers")
            ahead = const_expr(depth > 1 or not t.stage_smem or early)
            stats = cute.make_rmem_tensor(2, Float32)  # rstd and mean of the tile to come
            if const_expr(ahead):
                _load_stats(mRstd, mMean, stats, first.row, mX.shape[0], self.bias)
            rows, staging = (mX, mdY), (sX, sdY)
            if const_expr(t.stage_smem):
                for k in cutlass.range_constexpr(depth if early else max(depth - 1, 1)):
                    _copy_tile(t, copy, tidx, bidx + k * grid_m, rows, staging, depth, k, self.chunks, self.one_dy)
            for i in cutlass.range((tiles - bidx + grid_m - 1) // grid_m, unroll=1):
                ctx = R.RowContext.make(t, copy, mX, tidx, bidx + i * grid_m, i % 2, (i // 2) % 2)
                sXi = sdYi = None
                if const_expr(t.stage_smem):
                    sXi, sdYi = R.staged_tile(sX, depth, i % depth), self.dy_tile(sdY, depth, i % depth)
                if const_expr(t.stage_smem and depth > 1 and not early):
                    # tile i + depth - 1 into the buffer tile i - 1 was read from (by this thread
                    # alone: each thread reads back only what its own copies wrote)
                    j = i + depth - 1
                    _copy_tile(t, copy, tidx, bidx + j * grid_m, rows, staging, depth, j % depth, self.chunks,
                               self.one_dy)  # fmt: skip
                if const_expr(not t.stage_smem):
                    tXrX = R.load_row(ctx, mX, None, 0.0)
                    if const_expr(not self.one_dy):
                        tXrdY = R.load_row(ctx, mdY, None, 0.0)
                if const_expr(ahead):
                    rstd, mean = stats[0], stats[1]
                    _load_stats(mRstd, mMean, stats, ctx.row + grid_m * t.rows_per_cta, mX.shape[0], self.bias)
                else:
                    _load_stats(mRstd, mMean, stats, ctx.row, mX.shape[0], self.bias)
                    rstd, mean = stats[0], stats[1]
                if const_expr(self.chunks > 1):
                    self.chunked_tile(ctx, first, copy, bidx + (i + 1) * grid_m, rows, staging, (sXi, sdYi), rstd,
                                      mean, mW, tXrW, mdX, scratch, acc_w, acc_b)  # fmt: skip
                else:
                    if const_expr(t.stage_smem):
                        # (two commit groups a tile: those of the tiles still ahead may stay in flight)
                        cute.arch.cp_async_wait_group(2 * (depth - 1))
                        tXrX = R.read_staged_row(ctx, sXi, 0.0)
                        if const_expr(not self.one_dy):
                            tXrdY = R.read_staged_row(ctx, sdYi, 0.0)
                    x = R.widen(tXrX, self.widen_bits)
                    if const_expr(self.one_dy):
                        dy = self.one_value(ctx, x, mdY)
                    else:
                        dy = R.widen(tXrdY, self.widen_bits)
                    if const_expr(early):
                        # the tile is in registers: its buffer takes tile i + depth through the
                        # reduction (each thread overwrites only what it has read itself)
                        j = i + depth
                        _copy_tile(t, copy, tidx, bidx + j * grid_m, rows, staging, depth, j % depth, 1, self.one_dy)
                    # padding columns: dy reads 0, so g and every sum below get nothing from them
                    xhat, g = self.xhat_g(first, x, dy, rstd, mean, mW, tXrW)
                    self.accumulate(ctx, dy, xhat, acc_w, acc_b)
                    c1, c2 = self.row_totals(self.partials(g, xhat), scratch.at(ctx))
                    if const_expr(t.stage_smem and not early):
                        # x and dy again from shared memory rather than held in registers across
                        # the reduction (its barriers keep the compiler from reusing the first reads)
                        self.second_pass(ctx, first, bidx + (i + 1) * grid_m, rows, staging, (sXi, sdYi),
                                         (rstd, mean, c1, c2), mW, tXrW, mdX)  # fmt: skip
                    elif const_expr(t.stage_smem):
                        # (held in registers across the reduction: T.SECOND_READ)
                        R.store_row(ctx, self.dx_of_rows(first, x, dy, rstd, mean, c1, c2, mW, tXrW), mdX)
                    else:
                        R.store_row(ctx, self.dx(xhat, g, c1, c2, rstd), mdX)

        # Fold the CTA's rows' shares of each column sum (in row order, in shared memory)
        # and write them as partial row `bidx` of the workspace. The partial rows are seen
        # with a row mode of (rows_per_cta, cap) whose first part has stride 0: the CTA's
        # tile lands on its own partial row whatever its rows a CTA.
        part_layout = cute.make_layout(((t.rows_per_cta, self.cap), self.padded_n), stride=((0, self.padded_n), 1))
        for k in cutlass.range_constexpr(sums):
            acc = acc_b if const_expr(k == 1) else acc_w
            mPart = cute.make_tensor(mWork.iterator + k * self.cap * self.padded_n, part_layout)
            tXgP = copy.get_slice(tidx).partition_D(cute.local_tile(mPart, t.tiler_mn, (bidx, first.cta_col)))
            if const_expr(t.rows_per_cta == 1):
                cute.autovec_copy(acc, tXgP)
            else:
                cute.autovec_copy(acc, copy.get_slice(tidx).partition_D(sAcc[k]))
                cute.arch.barrier()
                if tidx < t.threads_per_row:
                    total = cute.make_rmem_tensor(acc.shape, Float32)
                    total.fill(0.0)
                    for r in cutlass.range_constexpr(t.rows_per_cta):
                        # (the thread r rows down holds the same columns)
                        theirs = copy.get_slice(tidx + r * t.threads_per_row).partition_D(sAcc[k])
                        total.store(total.load() + theirs.load())
                    cute.autovec_copy(total, tXgP)

    @cute.jit
    def second_pass(
        self, ctx: R.RowContext, first: R.RowContext, next_tile: Int32, rows: tuple, staging: tuple,
        buffers: tuple, stats: tuple, mW: cute.Tensor, tXrW: cute.Tensor, mdX: cute.Tensor,
    ):  # fmt: skip
        """A staged tile's dx from x and dy read again (`stats`: rstd, mean, c1, c2). With one
        tile staged, the next tile's copies go into the buffers once dx is made, or part by part
        as each is read (T.REFILL_PARTS); each thread overwrites only what it has read itself."""
        t = self.tiling
        rstd, mean, c1, c2 = stats
        parts = self.refill_parts
        for c in cutlass.range_constexpr(parts):
            part = c if const_expr(parts > 1) else None
            x = self.staged_values(ctx, buffers[0], part, parts)
            dy = self.dy_values(ctx, x, buffers[1], part, parts)
            if const_expr(parts > 1):
                nxt = R.RowContext.make(t, ctx.copy, rows[0], ctx.tidx, next_tile)
                _copy_rows(nxt, rows, staging, parts, part, self.one_dy)
            dx = self.dx_of_rows(first, x, dy, rstd, mean, c1, c2, mW, tXrW, part, parts)
            if const_expr(self.depth == 1 and parts == 1):
                # the next tile's rows stream in while this one's dx is written
                _copy_tile(t, ctx.copy, ctx.tidx, next_tile, rows, staging, 1, 0, 1, self.one_dy)
            R.store_row(ctx, dx, mdX, parts, part)

    @cute.jit
    def staged_values(self, ctx: R.RowContext, sX: cute.Tensor, c: int | None = None, parts: int = 0):
        """The thread's slice of a staged row (chunk `c` of `parts`, or of T.TILE_CHUNKS'), in fp32 (0
        in the padding columns)."""
        return R.widen(R.read_staged_row(ctx, sX, 0.0, parts or self.chunks, c), self.widen_bits)

    @cute.jit
    def dy_values(self, ctx: R.RowContext, x, sdY: cute.Tensor, c: int | None = None, parts: int = 0):
        """dy beside x (chunk `c` of `parts`): a staged row's, or with `one_dy`, the one value."""
        if const_expr(self.one_dy):
            return self.one_value(ctx, x, sdY)
        return self.staged_values(ctx, sdY, c, parts)

    @cute.jit
    def one_value(self, ctx: R.RowContext, x, mdY: cute.Tensor):
        """dy = mdY[0] in the row's columns and 0 in its padding, as a loaded row reads: the sums
        take nothing from the padding (where w may be unwritten shared memory, and xhat of
        LayerNorm is not 0). A chunked row has no padding (R.fitting_chunks)."""
        dy = cute.full_like(x, Float32(mdY[0]))
        if const_expr(not self.tiling.even_n):
            dy = R.zero_padding(ctx, dy)
        return dy

    def dy_tile(self, sdY: cute.Tensor, depth: int, k: Int32 | int) -> cute.Tensor:
        """Buffer `k` of dy's staging (with `one_dy`, the one value's tensor)."""
        return sdY if self.one_dy else R.staged_tile(sdY, depth, k)

    @cute.jit
    def weight(self, ctx: R.RowContext, mW: cute.Tensor, tXrW: cute.Tensor, c: int | None = None, parts: int = 0):
        if const_expr(self.weight_in == "late"):
            return R.widen(R.load_columns(ctx, mW, parts or self.chunks, c), self.widen_bits)
        return R.widen(R.chunk_of(tXrW, parts or self.chunks, c), self.widen_bits)

    @cute.jit
    def chunked_tile(
        self,
        ctx: R.RowContext,
        first: R.RowContext,
        copy: cute.TiledCopy,
        next_tile: Int32,
        rows: tuple,
        staging: tuple,
        buffers: tuple,
        rstd: Float32,
        mean: Float32,
        mW: cute.Tensor,
        tXrW: cute.Tensor,
        mdX: cute.Tensor,
        scratch: R.ReductionScratch,
        acc_w: cute.Tensor,
        acc_b: cute.Tensor,
    ):
        """A staged tile's two passes, a chunk at a time (T.TILE_CHUNKS): the first pass takes each
        chunk as soon as its own copies have landed, and with one tile staged the second pass
        sends the next tile's chunk into each buffer chunk it has read. The loop's arithmetic
        forms as a whole tile takes them."""
        t = self.tiling
        chunks, depth = self.chunks, self.depth
        sX, sdY = buffers
        sums = (Float32(0.0),) * (2 if self.bias else 1)
        for c in cutlass.range_constexpr(chunks):
            # (this tile's later chunks, and each tile still ahead, may stay in flight)
            cute.arch.cp_async_wait_group(2 * chunks * (depth - 1) + 2 * (chunks - 1 - c))
            x = self.staged_values(ctx, sX, c)
            dy = self.dy_values(ctx, x, sdY, c)
            xhat, g = self.xhat_g(first, x, dy, rstd, mean, mW, tXrW, c)
            self.accumulate(ctx, dy, xhat, R.chunk_of(acc_w, chunks, c), R.chunk_of(acc_b, chunks, c))
            sums = R.add(sums, self.partials(g, xhat))
        c1, c2 = self.row_totals(sums, scratch.at(ctx))
        for c in cutlass.range_constexpr(chunks):
            x = self.staged_values(ctx, sX, c)
            dy = self.dy_values(ctx, x, sdY, c)
            dx = self.dx_of_rows(first, x, dy, rstd, mean, c1, c2, mW, tXrW, c)
            if const_expr(depth == 1):
                # (each thread overwrites only what it has read itself)
                nxt = R.RowContext.make(t, copy, rows[0], ctx.tidx, next_tile)
                _copy_rows(nxt, rows, staging, chunks, c, self.one_dy)
            R.store_row(ctx, dx, mdX, chunks, c)

    @cute.jit
    def accumulate(self, ctx: R.RowContext, dy, xhat, acc_w: cute.Tensor, acc_b: cute.Tensor):
        """A row's share of dw (and db) into the thread's column sums."""
        if const_expr(self.tiling.rows_per_cta == 1 and "sums" in self.arithmetic):
            # Each tile the loops visit is below ceil(M / rows a tile), so a tile of one row is a
            # row of M: no branch, around which the compiler made x, dy and xhat a second time
            # (64 conversions and 32 FMAs more a tile at 32 values a thread).
            _add_products(acc_w, acc_b, dy, xhat, self.bias)
        else:
            if ctx.row_ok:  # (rows past M were never loaded)
                _add_products(acc_w, acc_b, dy, xhat, self.bias)

    @cute.jit
    def partials(self, g, xhat) -> tuple:
        """The thread's share of the row sums dx needs: sum(g * xhat), and with `bias` sum(g)."""
        gx = (g * xhat).reduce(cute.ReductionOp.ADD, init_val=0.0, reduction_profile=0)
        if const_expr(self.bias):
            return gx, g.reduce(cute.ReductionOp.ADD, init_val=0.0, reduction_profile=0)
        return (gx,)

    @cute.jit
    def row_totals(self, partials: tuple, scratch: R.ReductionScratch) -> tuple:
        """The row's (c1, c2) from every thread's `partials`."""
        return self.c1_c2(R.row_reduce(partials, R.add, self.tiling, scratch))

    def c1_c2(self, totals: tuple) -> tuple:
        """sum(g * xhat) and sum(g) from a row reduction's totals (sum(g) 0 without `bias`)."""
        return totals[0], totals[1] if self.bias else Float32(0.0)

    @cute.jit
    def xhat_g(
        self, ctx: R.RowContext, x, dy, rstd: Float32, mean: Float32, mW: cute.Tensor, tXrW: cute.Tensor,
        c: int | None = None, parts: int = 0,
    ):  # fmt: skip
        """The normalized row and dy * w (mean used with `bias` alone; chunk `c` of w)."""
        # (x * rstd - mean * rstd: one FMA a value, not a subtraction and a product. It errs by
        # the rounding of mean * rstd, at most an ulp of |x| * rstd where |mean| ~ |x|: the error
        # x's own rounding already carries, as the "shifted" case, a mean 100 sigma, checks)
        if const_expr(self.bias and "xhat" in self.arithmetic):
            xhat = x * rstd + (-mean * rstd)
        else:
            xhat = (x - mean) * rstd if const_expr(self.bias) else x * rstd
        return xhat, dy * self.weight(ctx, mW, tXrW, c, parts)

    @cute.jit
    def dx(self, xhat, g, c1: Float32, c2: Float32, rstd: Float32):
        """dx = (g - xhat * c1 / n - c2 / n) * rstd from the row sums c1 = sum(g * xhat) and
        c2 = sum(g) (`bias` alone), as two FMAs a value on the row's constants."""
        if const_expr("dx" not in self.arithmetic):
            return (g - xhat * (c1 * (1.0 / self.tiling.n)) - c2 * (1.0 / self.tiling.n)) * rstd
        k, shift = self.dx_terms(c1, c2, rstd)
        if const_expr(self.bias):
            return g * rstd + (xhat * k + shift)
        return g * rstd + xhat * k

    @cute.jit
    def dx_of_rows(
        self, ctx: R.RowContext, x, dy, rstd: Float32, mean: Float32, c1: Float32, c2: Float32, mW, tXrW,
        c: int | None = None, parts: int = 0,
    ):  # fmt: skip
        """`dx` from x and dy themselves, xhat folded into the row's constants: dy * w, then two
        FMAs a value, where making xhat and g again took seven operations. A staged row's
        second pass is its loop's longest stretch of arithmetic, and a long row's CTA is alone
        on its SM with nothing to hide it behind. H100, TB/s seven / two (with the one-row
        tiles' sums unbranched, see `accumulate`), every variant checked first
        (evals/results/h100-2026-11-25, fma.txt): layernorm 1024x262144 bf16 2.363 / 2.589,
        fp32 1.930 / 2.553 (156 B of spills gone); rmsnorm bf16 2.781 / 2.887."""
        if const_expr("dx" not in self.arithmetic):
            xhat, g = self.xhat_g(ctx, x, dy, rstd, mean, mW, tXrW, c, parts)
            return self.dx(xhat, g, c1, c2, rstd)
        k, shift = self.dx_terms(c1, c2, rstd)
        g = dy * self.weight(ctx, mW, tXrW, c, parts)
        if const_expr(self.bias):
            # xhat * k + shift = x * (rstd * k) + (shift - mean * rstd * k)
            return g * rstd + (x * (rstd * k) + (shift - mean * rstd * k))
        return g * rstd + x * (rstd * k)

    @cute.jit
    def dx_terms(self, c1: Float32, c2: Float32, rstd: Float32):
        """The row's factor of xhat and its constant term (`bias` alone) in dx."""
        inv_n = 1.0 / self.tiling.n
        return -c1 * inv_n * rstd, -c2 * inv_n * rstd

    @cute.jit
    def overlapped_rows(
        self,
        first: R.RowContext,
        copy: cute.TiledCopy,
        tidx: Int32,
        tiles: Int32,
        rows: tuple,
        staging: tuple,
        mW: cute.Tensor,
        tXrW: cute.Tensor,
        mMean: cute.Tensor,
        mRstd: cute.Tensor,
        mdX: cute.Tensor,
        scratch: R.ReductionScratch,
        acc_w: cute.Tensor,
        acc_b: cute.Tensor,
    ):
        """The row-tile loop with each tile's cluster reduction in flight while the next tile's
        partial sums are made and sent: tile i + 1's sums go out before tile i's total is
        waited on, so a CTA alone on its SM has work during the round trip between the
        peers. Three staged tiles (i, i + 1 and one in flight) and four reduction stages
        (see R.row_reduce_send)."""
        t = self.tiling
        depth = self.depth
        bidx, _, _ = cute.arch.block_idx()
        grid_m, _, _ = cute.arch.grid_dim()
        m = rows[0].shape[0]
        step = grid_m * t.rows_per_cta
        count = (tiles - bidx + grid_m - 1) // grid_m
        for k in cutlass.range_constexpr(depth - 1):
            _copy_tile(t, copy, tidx, bidx + k * grid_m, rows, staging, depth, k, 1, self.one_dy)
        stats = cute.make_rmem_tensor(2, Float32)  # rstd and mean of tile i
        stats_next = cute.make_rmem_tensor(2, Float32)  # of tile i + 1
        stats_after = cute.make_rmem_tensor(2, Float32)  # of tile i + 2
        _load_stats(mRstd, mMean, stats, first.row, m, self.bias)
        _load_stats(mRstd, mMean, stats_next, first.row + step, m, self.bias)
        cute.arch.cp_async_wait_group(2 * (depth - 2))  # tile 0 (the rest may stay in flight)
        ctx = R.RowContext.make(t, copy, rows[0], tidx, bidx, 0, 0)
        self.send_partials(ctx, staging, 0, stats, mW, tXrW, scratch, acc_w, acc_b)
        for i in cutlass.range(count, unroll=1):
            ctx = R.RowContext.make(t, copy, rows[0], tidx, bidx + i * grid_m, i % 4, (i // 4) % 2)
            # into the buffer tile i - 1 was read from (by this thread alone, see _copy_tile)
            j = i + depth - 1
            _copy_tile(t, copy, tidx, bidx + j * grid_m, rows, staging, depth, j % depth, 1, self.one_dy)
            _load_stats(mRstd, mMean, stats_after, ctx.row + 2 * step, m, self.bias)
            if i + 1 < count:
                k = i + 1
                after = R.RowContext.make(t, copy, rows[0], tidx, bidx + k * grid_m, k % 4, (k // 4) % 2)
                cute.arch.cp_async_wait_group(2 * (depth - 2))
                self.send_partials(after, staging, k % depth, stats_next, mW, tXrW, scratch, acc_w, acc_b)
            c1, c2 = self.c1_c2(R.row_reduce_wait(R.add, t, scratch.at(ctx)))
            x = self.staged_values(ctx, R.staged_tile(staging[0], depth, i % depth))
            dy = self.dy_values(ctx, x, self.dy_tile(staging[1], depth, i % depth))
            R.store_row(ctx, self.dx_of_rows(first, x, dy, stats[0], stats[1], c1, c2, mW, tXrW), mdX)
            stats.store(stats_next.load())
            stats_next.store(stats_after.load())

    @cute.jit
    def send_partials(
        self,
        ctx: R.RowContext,
        staging: tuple,
        buffer: Int32,
        stats: cute.Tensor,
        mW: cute.Tensor,
        tXrW: cute.Tensor,
        scratch: R.ReductionScratch,
        acc_w: cute.Tensor,
        acc_b: cute.Tensor,
    ):
        """A staged tile's share of dw (and db) into the accumulators, and its row sums on their
        way to the cluster (`R.row_reduce_send`)."""
        depth = self.depth
        x = self.staged_values(ctx, R.staged_tile(staging[0], depth, buffer))
        dy = self.dy_values(ctx, x, self.dy_tile(staging[1], depth, buffer))
        xhat, g = self.xhat_g(ctx, x, dy, stats[0], stats[1], mW, tXrW)
        self.accumulate(ctx, dy, xhat, acc_w, acc_b)
        R.row_reduce_send(self.partials(g, xhat), R.add, self.tiling, scratch.at(ctx))

    @cute.kernel
    def finish(self, mPart: cute.Tensor, mOut: cute.Tensor, rows: Int32):
        """mOut[c] = sum of partial rows' column c, in row order: warp w sums rows w, w +
        warps, ..., then warp 0 adds the warps' sums in warp order."""
        R.await_previous_grid(self.tiling)  # (the partial sums are the kernel's before)
        lane, warp = cute.arch.lane_idx(), cute.arch.warp_idx()
        bidx, _, _ = cute.arch.block_idx()
        col = bidx * R.WARP + lane
        smem = cutlass.memory.SmemAllocator()
        sSum = smem.allocate_tensor(Float32, cute.make_layout((R.WARP, self.finish_warps)), byte_alignment=16)
        acc = Float32(0.0)
        if col < self.tiling.n:
            for p in cutlass.range(warp, rows, self.finish_warps, unroll=8):
                acc += mPart[p * self.padded_n + col]
        sSum[lane, warp] = acc
        cute.arch.barrier()
        if warp == 0 and col < self.tiling.n:
            total = Float32(0.0)
            for w in cutlass.range_constexpr(self.finish_warps):
                total += sSum[lane, w]
            mOut[col] = total.to(mOut.element_type)


class NormBackwardScalar(NormBackward):
    """RMSNorm's backward for an upstream gradient that is one value c everywhere, read as that
    value (a `.sum()`'s, expanded: the rows kernel needs it dense first, one more launch a
    training step, issue 47). The same kernel, dy's loads and staging left out. Contract entry:
    `launch(mX, mdY, mW, mRstd, mdX, mdW, mWork, stream)`, mdY (1,) in x's dtype."""

    one_dy = True

    @cute.jit
    def __call__(
        self,
        mX: cute.Tensor,
        mdY: cute.Tensor,
        mW: cute.Tensor,
        mRstd: cute.Tensor,
        mdX: cute.Tensor,
        mdW: cute.Tensor,
        mWork: cute.Tensor,
        stream,
    ):
        self._launch(mdY, mX, mW, mRstd, mRstd, mdX, mdW, mdW, mWork, stream)


@cute.jit
def _add_products(acc_w: cute.Tensor, acc_b: cute.Tensor, dy, xhat, bias: bool):
    acc_w.store(acc_w.load() + dy * xhat)
    if const_expr(bias):
        acc_b.store(acc_b.load() + dy)


@cute.jit
def _load_stats(mRstd: cute.Tensor, mMean: cute.Tensor, stats: cute.Tensor, row: Int32, m: Int32, bias: bool):
    """rstd (and with `bias`, the mean) of `row` into `stats`; 0 past M."""
    stats.fill(0.0)
    if row < m:
        stats[0] = mRstd[row]
        if const_expr(bias):
            stats[1] = mMean[row]


def _copy_tile(
    t: R.RowTiling,
    copy: cute.TiledCopy,
    tidx: Int32,
    tile: Int32,
    rows: tuple,
    staging: tuple,
    depth: int,
    k: Int32 | int,
    chunks: int = 1,
    one_dy: bool = False,
) -> None:
    """cp.async row tile `tile` of each of `rows` into buffer `k` of its staging (one commit group
    a tensor and chunk, chunk by chunk: see T.TILE_CHUNKS; with `one_dy`, dy's an empty group)."""
    ctx = R.RowContext.make(t, copy, rows[0], tidx, tile)
    buffers = (R.staged_tile(staging[0], depth, k), staging[1] if one_dy else R.staged_tile(staging[1], depth, k))
    for c in range(chunks):
        _copy_rows(ctx, rows, buffers, chunks, c if chunks > 1 else None, one_dy)


def _copy_rows(ctx: R.RowContext, rows: tuple, buffers: tuple, chunks: int, c: int | None, one_dy: bool) -> None:
    """R.copy_row_async of x's row and dy's into their buffers (chunk `c` of `chunks`); with
    `one_dy`, dy is one value: an empty commit group in its place, since every wait of the loop
    counts two groups a tile."""
    R.copy_row_async(ctx, rows[0], buffers[0], chunks, c)
    if one_dy:
        cute.arch.cp_async_commit_group()
    else:
        R.copy_row_async(ctx, rows[1], buffers[1], chunks, c)


launch = NormBackward(R.RowKnobs())
