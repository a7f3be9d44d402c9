"""Softmax attention forward on Hopper, warp-specialised: a producer warp streams Q, K and V
tiles in with TMA through an mbarrier pipeline, and two consumer warpgroups of 64 query rows
each issue warpgroup MMAs (WGMMA): S = Q K^T from shared memory, O += P V with P straight from
registers (the scores' accumulator converted in place, never staged).

Two overlaps keep the tensor cores fed:
- within a warpgroup, key tile j's Q K^T is issued together with tile j-1's P V, and the
  softmax of tile j runs while that P V is still in flight (the output is rescaled once it
  has landed, by the factor the softmax left aside);
- between the warpgroups, a pair of named barriers hands the right to issue MMAs back and
  forth (ping-pong), so one warpgroup's softmax runs under the other's MMAs.

Causal: a CTA's key tiles stop at its last query; the CTAs with the most tiles are launched
first (across a group of heads whose keys and values L2 holds), so the short ones fill the tail.

Kernel contract entry: `launch(mQ, mK, mV, mO, mLse, scale, stream)`; mQ, mK, mV, mO (M, N, D)
with M the (batch x head) pairs, N the sequence length, D the head dim (64 or 128); mLse (M, N)
fp32; bf16 or fp16. mV and mO may also be (B, H, N, D) at any strides whose last is 1 and the
others multiples of 16 bytes, M = B x H: a model's v (a transposed view of its projection's (B, N,
H, D)) read where it lies, its TMA view ((H, B), N, D), so head m = b x H + h; o stored through the
same view (laid out as the backward's kernel reads it). (`attention_sm80.py` is the same algorithm
with Ampere's instructions.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

from reference_kernels import reduce as R
from reference_kernels.attention_softmax import fold_scores, normalize_rows, rescale_rows
from reference_kernels.tuning import attention as T

OP = "attention"
WARPGROUP = 128
ROWS = 64  # query rows of a consumer warpgroup (the WGMMA's M)
CONSUMERS = 2
BLOCK_M = ROWS * CONSUMERS
# setmaxnreg: the producer warpgroup gives its registers to the consumers (24 + 2 x 240 per
# thread of a warpgroup fits the SM's 64K at 384 threads)
PRODUCER_REGS = 24
CONSUMER_REGS = 240
# named barriers 1 and 2: "warpgroup w may issue its MMAs" (0 is the CTA-wide barrier)
TURN_BARRIER = 1


def _acc_rows_cols(acc: cute.Tensor) -> cute.Tensor:
    """A WGMMA accumulator ((2, 2, V), MMA_M, MMA_N) seen as (rows, cols) of the thread's
    values: a thread holds 2 rows (8 apart) of V pairs of adjacent columns, 8 apart."""
    flat = cute.make_layout(acc.layout.shape)
    s, d = flat.shape, flat.stride
    rows_cols = cute.make_layout(
        ((s[0][1], s[1]), (s[0][0], s[0][2], s[2])),
        stride=((d[0][1], d[1]), (d[0][0], d[0][2], d[2])),
    )
    return cute.make_tensor(acc.iterator, cute.composition(acc.layout, rows_cols))


def _as_operand_a(p: cute.Tensor) -> cute.Tensor:
    """Scores in the input dtype, in the accumulator's ((2, 2, V), 1, 1) order, as the A operand
    of P V from registers, ((2, 2, 2), 1, V / 2): for 16-bit types a k16 slice of A holds, in
    each thread, the values of two adjacent n8 column groups of C, so this is a re-view, no
    data moves."""
    flat = cute.make_layout(p.layout.shape)
    v = flat.shape[0][2]
    d = flat.stride[0]
    layout = cute.make_layout(
        ((2, 2, 2), 1, v // 2),
        stride=((d[0], d[1], d[2]), 0, d[2] * 2),
    )
    return cute.make_tensor(p.iterator, cute.composition(p.layout, layout))


@dataclass(frozen=True)
class AttentionKnobs:
    """block_n: keys a tile (a multiple of 16; a consumer thread holds block_n / 2 fp32 scores
    beside D / 2 of output and block_n / 4 of P). stages: K and V tiles in flight (shared
    memory: Q 2 x 64 x D, then stages x block_n x D for each of K and V). head_group: how many
    heads' query tiles interleave in launch order, 0 for as many as L2 holds the keys and values
    of (a power of two), None for the mask's default (T.CAUSAL_HEAD_GROUP by N, or 1). Under a causal mask the tiles of a group
    come longest first, so the short ones fill the tail; 1 keeps each head's tiles together
    (what a CTA's neighbours read is its own K and V), and a group larger than L2 holds makes
    every CTA stream its own (non-causal, 0 ran 3-11% slower than 1 at N = 2K-8K)."""

    block_n: int = 128
    stages: int = 2
    head_group: int | None = None


def tile_of(pos, heads, m_blocks: int, group: int, causal: bool):
    """The (query tile, head) launched pos-th (in a kernel on Int32s, or on ints in a test):
    launch order runs over groups of `group` heads, in a group over the query tiles (longest
    first when causal) and over the group's heads fastest. The last group may hold fewer."""
    first = pos // (group * m_blocks) * group  # the group's first head
    size = cutlass.min(heads - first, group)
    within = pos - first * m_blocks
    m_block, head = within // size, first + within % size
    if causal:
        m_block = m_blocks - 1 - m_block
    return m_block, head


def heads_as_m(mX: cute.Tensor) -> cute.Tensor:
    """A (B, H, N, D) tensor at its own strides as ((H, B), N, D): mode 0 indexed by m = b x H + h,
    the (b x h) order of the dense (M, N, D) layout."""
    b, h, n, d = mX.shape
    sb, sh, sn, _ = mX.stride
    return cute.make_tensor(mX.iterator, cute.make_layout(((h, b), n, d), stride=((sh, sb), sn, 1)))


class Attention:
    # (compiled.py: also compiled for v and o of (B, H, N, D) at run-time strides: a model's v, a
    # transposed view, read where it lies; o written in the layout torch's backward kernel reads)
    takes_strided_v = True

    def __init__(self, causal: bool = False, knobs: AttentionKnobs = AttentionKnobs()) -> None:
        self.causal = causal
        self.knobs = knobs
        self.bn, self.stages = knobs.block_n, knobs.stages
        self.threads = (CONSUMERS + 1) * WARPGROUP

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mO: cute.Tensor,
        mLse: cute.Tensor,
        scale: Float32,
        stream,
    ):
        if const_expr(cute.rank(mV) == 4):
            mV = heads_as_m(mV)
        if const_expr(cute.rank(mO) == 4):  # (the epilogue's stores take any strides)
            mO = heads_as_m(mO)
        dtype = mQ.element_type
        self.d = mQ.shape[2]
        self.n = mQ.shape[1]
        if const_expr(self.d % 64 or self.d > 128):
            raise ValueError(f"head dim {self.d}: 64 or 128")
        K, MN = LayoutEnum.ROW_MAJOR, LayoutEnum.COL_MAJOR
        # Q K^T twice over: its first k-block overwrites S, the rest accumulate. (Zeroing S
        # instead costs a move a value, and the compiler schedules those after the WGMMA fence,
        # where ptxas must insert another wait for them.)
        qk, qk_first = (
            sm90.make_trivial_tiled_mma(
                dtype,
                dtype,
                K.sm90_mma_major_mode(),
                K.sm90_mma_major_mode(),
                Float32,
                (1, 1, 1),
                tiler_mn=(ROWS, self.bn),
            )
            for _ in range(2)
        )
        # V is (keys, D) with D contiguous: as the B operand (D, keys) it is MN-major
        pv = sm90.make_trivial_tiled_mma(dtype, dtype, K.sm90_mma_major_mode(), MN.sm90_mma_major_mode(), Float32,
                                         (1, 1, 1), tiler_mn=(ROWS, self.d), a_source=warpgroup.OperandSource.RMEM)  # fmt: skip
        # Q: one stage per consumer warpgroup; K and V: `stages` tiles each
        sQ_layout = sm90.make_smem_layout_a(K, (ROWS, self.bn, self.d), dtype, CONSUMERS)
        sK_layout = sm90.make_smem_layout_b(K, (ROWS, self.bn, self.d), dtype, self.stages)
        sV_layout = sm90.make_smem_layout_b(MN, (ROWS, self.d, self.bn), dtype, self.stages)
        # TMA sees (sequence, D, head) for Q and K and (D, sequence, head) for V, so a tile is
        # addressed as (block, 0, head)
        seq_d = cute.make_tensor(mQ.iterator, cute.select(mQ.layout, mode=[1, 2, 0]))
        tma_q, tQ = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), seq_d, cute.slice_(sQ_layout, (None, None, 0)), (ROWS, self.d)
        )
        seq_d = cute.make_tensor(mK.iterator, cute.select(mK.layout, mode=[1, 2, 0]))
        tma_k, tK = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), seq_d, cute.slice_(sK_layout, (None, None, 0)), (self.bn, self.d)
        )
        d_seq = cute.make_tensor(mV.iterator, cute.select(mV.layout, mode=[2, 1, 0]))
        tma_v, tV = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), d_seq, cute.slice_(sV_layout, (None, None, 0)), (self.d, self.bn)
        )
        self.tile_bytes = self.bn * self.d * dtype.width // 8
        self.q_bytes = BLOCK_M * self.d * dtype.width // 8

        @cute.struct
        class Storage:
            q_full: cute.struct.MemRange[cutlass.Int64, 1]
            k_bars: cute.struct.MemRange[cutlass.Int64, 2 * self.stages]
            v_bars: cute.struct.MemRange[cutlass.Int64, 2 * self.stages]
            sQ: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sV_layout)], 1024]

        self.storage = Storage
        scale_log2 = scale * R.LOG2_E
        self.kernel(tma_q, tQ, tma_k, tK, tma_v, tV, mO, mLse, scale, scale_log2, qk, qk_first, pv,
                    sQ_layout, sK_layout, sV_layout, mQ.shape[0]).launch(
            grid=self.grid(cute.ceil_div(self.n, BLOCK_M), mQ.shape[0], self.head_group(dtype.width // 8)),
            block=[self.threads, 1, 1], stream=stream,
            min_blocks_per_mp=1,
        )  # fmt: skip

    def head_group(self, dtype_bytes: int) -> int:
        group = self.knobs.head_group
        if group is None:
            group = R.pick(T.CAUSAL_HEAD_GROUP, self.n) if self.causal else 1
        if group:
            return group
        fit = T.L2_BYTES // (2 * self.n * self.d * dtype_bytes)
        return 1 << max(fit.bit_length() - 1, 0)

    def grid(self, m_blocks, heads, group: int) -> list:
        # (a group of one: the query tile and the head are the block's x and y, decoded from
        # nothing; that leaves ptxas a few registers more than the 1-D order's divisions do)
        return [m_blocks, heads, 1] if group == 1 else [m_blocks * heads, 1, 1]

    @cute.jit
    def tile(self, heads: Int32, group: cutlass.Constexpr):
        m_blocks = cute.ceil_div(self.n, BLOCK_M)
        if const_expr(group == 1):
            m_block, head, _ = cute.arch.block_idx()
            if const_expr(self.causal):
                m_block = m_blocks - 1 - m_block
            return m_block, head
        return tile_of(cute.arch.block_idx()[0], heads, m_blocks, group, self.causal)

    @cute.kernel
    def kernel(
        self,
        tma_q: cute.CopyAtom,
        tQ: cute.Tensor,
        tma_k: cute.CopyAtom,
        tK: cute.Tensor,
        tma_v: cute.CopyAtom,
        tV: cute.Tensor,
        mO: cute.Tensor,
        mLse: cute.Tensor,
        scale: Float32,
        scale_log2: Float32,
        qk: cute.TiledMma,
        qk_first: cute.TiledMma,
        pv: cute.TiledMma,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        heads: Int32,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        m_block, head = self.tile(heads, self.head_group(mO.element_type.width // 8))
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = cute.arch.make_warp_uniform(tidx // WARPGROUP)
        n_blocks = cute.ceil_div(self.n, self.bn)
        if const_expr(self.causal):
            n_blocks = cutlass.min(cute.ceil_div((m_block + 1) * BLOCK_M, self.bn), n_blocks)

        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(self.storage)
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        q_full = storage.q_full.data_ptr()
        consumer_warps = CONSUMERS * WARPGROUP // R.WARP  # (one thread of each warp releases a stage)
        k_pipe, v_pipe = (
            pipeline.PipelineTmaAsync.create(
                barrier_storage=bars,
                num_stages=self.stages,
                tx_count=self.tile_bytes,
                defer_sync=True,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1),
                consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, consumer_warps),
            )
            for bars in (storage.k_bars.data_ptr(), storage.v_bars.data_ptr())
        )
        if warp == 0:
            with cute.arch.elect_one():
                cute.arch.mbarrier_init(q_full, 1)
        cute.arch.mbarrier_init_fence()
        cute.arch.barrier()

        if wg == 0:
            cute.arch.setmaxregister_decrease(PRODUCER_REGS)
            if warp == 0:
                self.produce(tma_q, tQ, tma_k, tK, tma_v, tV, sQ, sK, sV, q_full, k_pipe, v_pipe, m_block, head,
                             n_blocks)  # fmt: skip
        else:
            cute.arch.setmaxregister_increase(CONSUMER_REGS)
            self.consume(qk, qk_first, pv, sQ, sK, sV, q_full, k_pipe, v_pipe, mO, mLse, m_block, head, n_blocks,
                         wg - 1, tidx % WARPGROUP, scale, scale_log2)  # fmt: skip

    @cute.jit
    def produce(self, tma_q, tQ, tma_k, tK, tma_v, tV, sQ, sK, sV, q_full, k_pipe, v_pipe, m_block, head, n_blocks):
        """One warp: Q once (both warpgroups' halves on one barrier), then K_j and V_j as
        stages free up."""
        for atom in (tma_q, tma_k, tma_v):
            cpasync.prefetch_descriptor(atom)
        gQ = cute.local_tile(tQ[None, None, head], (ROWS, self.d), (None, 0))
        gK = cute.local_tile(tK[None, None, head], (self.bn, self.d), (None, 0))
        gV = cute.local_tile(tV[None, None, head], (self.d, self.bn), (0, None))
        no_cluster = cute.make_layout(1)
        tQsQ, tQgQ = cpasync.tma_partition(tma_q, 0, no_cluster, cute.group_modes(sQ, 0, 2), cute.group_modes(gQ, 0, 2))
        tKsK, tKgK = cpasync.tma_partition(tma_k, 0, no_cluster, cute.group_modes(sK, 0, 2), cute.group_modes(gK, 0, 2))
        tVsV, tVgV = cpasync.tma_partition(tma_v, 0, no_cluster, cute.group_modes(sV, 0, 2), cute.group_modes(gV, 0, 2))
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive_and_expect_tx(q_full, self.q_bytes)
        for half in cutlass.range_constexpr(CONSUMERS):
            cute.copy(tma_q, tQgQ[None, m_block * CONSUMERS + half], tQsQ[None, half], tma_bar_ptr=q_full)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        for j in cutlass.range(n_blocks, unroll=1):
            k_pipe.producer_acquire(state)
            cute.copy(tma_k, tKgK[None, j], tKsK[None, state.index], tma_bar_ptr=k_pipe.producer_get_barrier(state))
            v_pipe.producer_acquire(state)
            cute.copy(tma_v, tVgV[None, j], tVsV[None, state.index], tma_bar_ptr=v_pipe.producer_get_barrier(state))
            state.advance()

    @cute.jit
    def consume(self, qk, qk_first, pv, sQ, sK, sV, q_full, k_pipe, v_pipe, mO, mLse, m_block, head, n_blocks,
                w: Int32, t: Int32, scale: Float32, scale_log2: Float32):  # fmt: skip
        """Warpgroup w's 64 query rows against every key tile."""
        dtype = mO.element_type
        rows_block = m_block * CONSUMERS + w  # this warpgroup's tile of ROWS queries
        thr_qk, thr_pv = qk.get_slice(t), pv.get_slice(t)
        tSrQ = qk.make_fragment_A(thr_qk.partition_A(sQ))
        tSrK = qk.make_fragment_B(thr_qk.partition_B(sK))
        tOrV = pv.make_fragment_B(thr_pv.partition_B(sV))
        acc_S = cute.make_rmem_tensor(thr_qk.partition_shape_C((ROWS, self.bn)), Float32)
        acc_O = cute.make_rmem_tensor(thr_pv.partition_shape_C((ROWS, self.d)), Float32)
        acc_O.fill(0.0)
        rP = cute.make_rmem_tensor_like(acc_S, dtype)
        tOrP = _as_operand_a(rP)
        cS = cute.local_tile(cute.make_identity_tensor((self.n, self.n)), (ROWS, self.bn), (rows_block, 0))
        tScS = _acc_rows_cols(thr_qk.partition_C(cS))
        s, o = _acc_rows_cols(acc_S), _acc_rows_cols(acc_O)
        rows = cute.size(tScS, mode=[0])
        row_max = cute.make_rmem_tensor(rows, Float32)
        row_sum = cute.make_rmem_tensor(rows, Float32)
        row_scale = cute.make_rmem_tensor(rows, Float32)
        row_max.fill(-math.inf)
        row_sum.fill(0.0)
        # (each MMA's accumulate flag is one value for the whole kernel, not state of the loop)
        qk_first.set(warpgroup.Field.ACCUMULATE, False)
        qk.set(warpgroup.Field.ACCUMULATE, True)
        pv.set(warpgroup.Field.ACCUMULATE, True)
        if w == 0:
            cute.arch.barrier_arrive(barrier_id=TURN_BARRIER, number_of_threads=2 * WARPGROUP)  # w 0 goes first
        cute.arch.mbarrier_wait(q_full, 0)

        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        k_pipe.consumer_wait(state)
        self.wait_turn(w)
        warpgroup.fence()
        self.gemm(qk, acc_S, tSrQ, tSrK, w, state.index, qk_first)
        warpgroup.commit_group()
        self.pass_turn(w, False)
        warpgroup.wait_group(0)
        k_pipe.consumer_release(state)
        fold_scores(s, row_max, row_sum, row_scale, tScS, 0, rows_block, scale_log2, ROWS, self.bn, self.n, self.causal)
        rP.store(acc_S.load().to(dtype))

        for j in cutlass.range(1, n_blocks, unroll=1):
            state_v = state.clone()
            state.advance()
            k_pipe.consumer_wait(state)
            self.wait_turn(w)
            warpgroup.fence()
            self.gemm(qk, acc_S, tSrQ, tSrK, w, state.index, qk_first)  # S_j = Q K_j^T
            warpgroup.commit_group()
            v_pipe.consumer_wait(state_v)
            warpgroup.fence()  # (the compiler may move register writes past the first fence)
            self.gemm(pv, acc_O, tOrP, tOrV, None, state_v.index)  # O += P_{j-1} V_{j-1}
            warpgroup.commit_group()
            self.pass_turn(w, False)
            warpgroup.wait_group(1)
            k_pipe.consumer_release(state)
            fold_scores(s, row_max, row_sum, row_scale, tScS, j, rows_block, scale_log2, ROWS, self.bn, self.n,
                        self.causal)  # fmt: skip
            warpgroup.wait_group(0)
            v_pipe.consumer_release(state_v)
            rP.store(acc_S.load().to(dtype))
            rescale_rows(o, row_scale)

        v_pipe.consumer_wait(state)
        self.wait_turn(w)
        warpgroup.fence()
        self.gemm(pv, acc_O, tOrP, tOrV, None, state.index)
        warpgroup.commit_group()
        self.pass_turn(w, True)
        warpgroup.wait_group(0)
        v_pipe.consumer_release(state)
        self.epilogue(mO, mLse, acc_O, row_max, row_sum, tScS, thr_pv, rows_block, head, scale)

    @cute.jit
    def gemm(self, mma: cute.TiledMma, acc: cute.Tensor, tA: cute.Tensor, tB: cute.Tensor, a_stage, b_stage: Int32,
             first: cute.TiledMma | None = None):  # fmt: skip
        """acc (+)= A B over the k-blocks; `first`, if given, issues k-block 0 (overwriting acc)."""
        for k in cutlass.range_constexpr(cute.size(tA, mode=[2])):
            a = tA[None, None, k] if const_expr(a_stage is None) else tA[None, None, k, a_stage]
            cute.gemm(
                first if const_expr(k == 0 and first is not None) else mma, acc, a, tB[None, None, k, b_stage], acc
            )

    @cute.jit
    def wait_turn(self, w: Int32):
        cute.arch.barrier(barrier_id=TURN_BARRIER + w, number_of_threads=2 * WARPGROUP)

    @cute.jit
    def pass_turn(self, w: Int32, last: cutlass.Constexpr):
        # (warpgroup 1's last turn has no taker: it is not passed, so no arrival is left behind)
        if const_expr(last):
            if w == 0:
                cute.arch.barrier_arrive(barrier_id=TURN_BARRIER + 1, number_of_threads=2 * WARPGROUP)
        else:
            cute.arch.barrier_arrive(barrier_id=TURN_BARRIER + 1 - w, number_of_threads=2 * WARPGROUP)

    @cute.jit
    def epilogue(self, mO, mLse, acc_O, row_max, row_sum, tScS, thr_pv, rows_block, head, scale: Float32):
        """o = acc / sum written straight from the accumulators (2-element stores), lse by the
        first lane of each quad."""
        normalize_rows(_acc_rows_cols(acc_O), row_max, row_sum, tScS, mLse, head, self.n, scale)
        rO = cute.make_rmem_tensor_like(acc_O, mO.element_type)
        rO.store(acc_O.load().to(mO.element_type))
        gO = cute.local_tile(mO[head, None, None], (ROWS, self.d), (rows_block, 0))
        cO = cute.local_tile(cute.make_identity_tensor((self.n, self.d)), (ROWS, self.d), (rows_block, 0))
        tOgO, tOcO = thr_pv.partition_C(gO), thr_pv.partition_C(cO)
        for i in cutlass.range_constexpr(cute.size(rO)):
            if tOcO[i][0] < self.n:
                tOgO[i] = rO[i]


launch = Attention(causal=False)
