"""Softmax attention forward on Hopper's warpgroup MMA (WGMMA): the `attention` contract, with
both GEMMs issued by warpgroups from shared memory. Two warpgroups own 64 query rows each; a
key tile's scores S = Q K^T come back in fp32 registers, the online softmax runs there (as in
`attention.py`), P is written to shared memory in the input dtype and O += P V is a second
shared-memory WGMMA.

Kernel contract entry: `launch(mQ, mK, mV, mO, mLse, scale, stream)`, as `attention`.

Not yet verified on a GPU (compiled for sm_90a only): it is offered by the offline search as a
candidate beside the verified reference, never shipped as the reference itself. Loads are
cp.async and single-buffered; TMA, a producer warp and ping-pong scheduling are the next steps.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90
from cutlass import Float32, const_expr
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

from reference_kernels import reduce as R
from reference_kernels.attention import normalize_rows, online_softmax

OP = "attention"
COPY_BITS = 128
WARPGROUP = 128
BLOCK_M = 128  # two warpgroups of 64 query rows
BLOCK_N = 128  # keys a tile


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


class AttentionSm90:
    def __init__(self, causal: bool = False) -> None:
        self.causal = causal
        self.threads = BLOCK_M // 64 * WARPGROUP

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
        dtype = mQ.element_type
        self.d = mQ.shape[2]
        self.n = mQ.shape[1]
        if const_expr(self.d % 64 or self.d > 128):
            raise ValueError(f"head dim {self.d}: 64 or 128")
        warpgroups = (BLOCK_M // 64, 1, 1)
        K, MN = LayoutEnum.ROW_MAJOR, LayoutEnum.COL_MAJOR
        qk = sm90.make_trivial_tiled_mma(dtype, dtype, K.sm90_mma_major_mode(), K.sm90_mma_major_mode(), Float32,
                                         warpgroups, tiler_mn=(64, BLOCK_N))  # fmt: skip
        # (V is (keys, D) with D contiguous: as the B operand (D, keys) it is MN-major)
        pv = sm90.make_trivial_tiled_mma(dtype, dtype, K.sm90_mma_major_mode(), MN.sm90_mma_major_mode(), Float32,
                                         warpgroups, tiler_mn=(64, self.d))  # fmt: skip
        sQ_layout = sm90.make_smem_layout_a(K, (BLOCK_M, BLOCK_N, self.d), dtype, 1)
        sK_layout = sm90.make_smem_layout_b(K, (BLOCK_M, BLOCK_N, self.d), dtype, 1)
        sP_layout = sm90.make_smem_layout_a(K, (BLOCK_M, self.d, BLOCK_N), dtype, 1)
        sV_layout = sm90.make_smem_layout_b(MN, (BLOCK_M, self.d, BLOCK_N), dtype, 1)
        vec = COPY_BITS // dtype.width
        along = self.d // vec  # threads across a row of D
        atom = cute.make_copy_atom(
            cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), dtype, num_bits_per_copy=COPY_BITS
        )
        # rows of Q and K: D contiguous, vectors along D
        load_rows = cute.make_tiled_copy_tv(
            atom, cute.make_layout((self.threads // along, along), stride=(along, 1)), cute.make_layout((1, vec))
        )
        # V seen as (D, keys): D contiguous, vectors along mode 0
        load_cols = cute.make_tiled_copy_tv(
            atom, cute.make_layout((along, self.threads // along), stride=(1, along)), cute.make_layout((vec, 1))
        )
        scale_log2 = scale * R.LOG2_E
        self.kernel(mQ, mK, mV, mO, mLse, scale, scale_log2, qk, pv, sQ_layout, sK_layout, sP_layout, sV_layout,
                    load_rows, load_cols).launch(
            grid=[cute.ceil_div(self.n, BLOCK_M), mQ.shape[0], 1], block=[self.threads, 1, 1], stream=stream
        )  # fmt: skip

    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mO: cute.Tensor,
        mLse: cute.Tensor,
        scale: Float32,
        scale_log2: Float32,
        qk: cute.TiledMma,
        pv: cute.TiledMma,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sP_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        load_rows: cute.TiledCopy,
        load_cols: cute.TiledCopy,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        m_block, head, _ = cute.arch.block_idx()
        dtype = mQ.element_type
        n_blocks = cute.ceil_div(self.n, BLOCK_N)
        if const_expr(self.causal):
            n_blocks = cutlass.min(cute.ceil_div((m_block + 1) * BLOCK_M, BLOCK_N), n_blocks)

        smem = cutlass.memory.SmemAllocator()
        sQ = smem.allocate_tensor(dtype, sQ_layout.outer, byte_alignment=1024, swizzle=sQ_layout.inner)
        sK = smem.allocate_tensor(dtype, sK_layout.outer, byte_alignment=1024, swizzle=sK_layout.inner)
        sP = smem.allocate_tensor(dtype, sP_layout.outer, byte_alignment=1024, swizzle=sP_layout.inner)
        sV = smem.allocate_tensor(dtype, sV_layout.outer, byte_alignment=1024, swizzle=sV_layout.inner)

        # global tiles: Q and K as (rows, D); V as (D, keys)
        rows = cute.make_identity_tensor((self.n, self.d))
        gQ = cute.local_tile(mQ[head, None, None], (BLOCK_M, self.d), (m_block, 0))
        cQ = cute.local_tile(rows, (BLOCK_M, self.d), (m_block, 0))
        gK = cute.local_tile(mK[head, None, None], (BLOCK_N, self.d), (None, 0))
        cK = cute.local_tile(rows, (BLOCK_N, self.d), (None, 0))
        mVt = cute.make_tensor(mV[head, None, None].iterator, cute.make_layout((self.d, self.n), stride=(1, self.d)))
        gVt = cute.local_tile(mVt, (self.d, BLOCK_N), (0, None))
        cVt = cute.local_tile(cute.make_identity_tensor((self.d, self.n)), (self.d, BLOCK_N), (0, None))

        thr_rows, thr_cols = load_rows.get_slice(tidx), load_cols.get_slice(tidx)
        tQgQ, tQsQ, tQcQ = thr_rows.partition_S(gQ), thr_rows.partition_D(sQ[None, None, 0]), thr_rows.partition_S(cQ)
        tKgK, tKsK, tKcK = thr_rows.partition_S(gK), thr_rows.partition_D(sK[None, None, 0]), thr_rows.partition_S(cK)
        tVgV, tVsV, tVcV = thr_cols.partition_S(gVt), thr_cols.partition_D(sV[None, None, 0]), thr_cols.partition_S(cVt)

        _load(load_rows, tQgQ, tQsQ, tQcQ, 0, self.n, 1)
        _load(load_rows, tKgK[None, None, None, 0], tKsK, tKcK[None, None, None, 0], 0, self.n, 1)
        _load(load_cols, tVgV[None, None, None, 0], tVsV, tVcV[None, None, None, 0], 1, self.n, 2)
        cute.arch.cp_async_commit_group()

        thr_qk, thr_pv = qk.get_slice(tidx), pv.get_slice(tidx)
        tSrQ = qk.make_fragment_A(thr_qk.partition_A(sQ))
        tSrK = qk.make_fragment_B(thr_qk.partition_B(sK))
        tOrP = pv.make_fragment_A(thr_pv.partition_A(sP))
        tOrV = pv.make_fragment_B(thr_pv.partition_B(sV))
        tSsP = thr_qk.partition_C(sP[None, None, 0])  # (P has S's (query, key) coordinates)
        acc_O = cute.make_rmem_tensor(thr_pv.partition_shape_C((BLOCK_M, self.d)), Float32)
        acc_O.fill(0.0)
        cS = cute.local_tile(cute.make_identity_tensor((self.n, self.n)), (BLOCK_M, BLOCK_N), (m_block, 0))
        tScS = _acc_rows_cols(thr_qk.partition_C(cS))
        row_max = cute.make_rmem_tensor(cute.size(tScS, mode=[0]), Float32)
        row_sum = cute.make_rmem_tensor(cute.size(tScS, mode=[0]), Float32)
        row_max.fill(-math.inf)
        row_sum.fill(0.0)
        qk.set(warpgroup.Field.ACCUMULATE, True)
        pv.set(warpgroup.Field.ACCUMULATE, True)

        for j in cutlass.range(n_blocks, unroll=1):
            cute.arch.cp_async_wait_group(0)
            # cp.async and the zero fill write through the generic proxy; WGMMA reads through
            # the async one: each thread's writes are made visible to it before the barrier
            cute.arch.fence_view_async_shared()
            cute.arch.barrier()  # K_j, V_j (and Q) staged
            # (zeroed and accumulated into, rather than a first MMA that overwrites: the MMA's
            # accumulate flag is then one value for the whole kernel, not state of the loop)
            acc_S = cute.make_rmem_tensor(thr_qk.partition_shape_C((BLOCK_M, BLOCK_N)), Float32)
            acc_S.fill(0.0)
            warpgroup.fence()
            for k in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
                cute.gemm(qk, acc_S, tSrQ[None, None, k, 0], tSrK[None, None, k, 0], acc_S)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            cute.arch.barrier()  # every warpgroup is done reading K_j
            if j + 1 < n_blocks:
                _load(load_rows, tKgK[None, None, None, j + 1], tKsK, tKcK[None, None, None, j + 1], 0, self.n, 1)
                cute.arch.cp_async_commit_group()

            s, o = _acc_rows_cols(acc_S), _acc_rows_cols(acc_O)
            online_softmax(s, o, row_max, row_sum, tScS, j, m_block, scale_log2, BLOCK_M, BLOCK_N, self.n, self.causal)
            rP = cute.make_rmem_tensor_like(acc_S, dtype)
            rP.store(acc_S.load().to(dtype))
            cute.autovec_copy(rP, tSsP)
            cute.arch.fence_view_async_shared()  # P's generic-proxy stores, seen by the async proxy
            cute.arch.barrier()
            warpgroup.fence()
            for k in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
                cute.gemm(pv, acc_O, tOrP[None, None, k, 0], tOrV[None, None, k, 0], acc_O)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            cute.arch.barrier()  # every warpgroup is done reading V_j and P
            if j + 1 < n_blocks:
                _load(load_cols, tVgV[None, None, None, j + 1], tVsV, tVcV[None, None, None, j + 1], 1, self.n, 2)
                cute.arch.cp_async_commit_group()

        self.epilogue(mO, mLse, acc_O, row_max, row_sum, tScS, thr_pv, m_block, head, scale)

    @cute.jit
    def epilogue(self, mO, mLse, acc_O, row_max, row_sum, tScS, thr_pv, m_block, head, scale: Float32):
        """o = acc / sum written straight from the accumulators (2-element stores), lse by the
        first lane of each quad."""
        normalize_rows(_acc_rows_cols(acc_O), row_max, row_sum, tScS, mLse, head, self.n, scale)
        rO = cute.make_rmem_tensor_like(acc_O, mO.element_type)
        rO.store(acc_O.load().to(mO.element_type))
        gO = cute.local_tile(mO[head, None, None], (BLOCK_M, self.d), (m_block, 0))
        cO = cute.local_tile(cute.make_identity_tensor((self.n, self.d)), (BLOCK_M, self.d), (m_block, 0))
        tOgO, tOcO = thr_pv.partition_C(gO), thr_pv.partition_C(cO)
        for i in cutlass.range_constexpr(cute.size(rO)):
            if tOcO[i][0] < self.n:
                tOgO[i] = rO[i]


@cute.jit
def _load(load: cute.TiledCopy, tgX, tsX, tcX, axis: cutlass.Constexpr, n: cutlass.Constexpr, mode: cutlass.Constexpr):
    """cp.async the slices of a tile whose sequence index (coordinate `axis`) lies inside the
    sequence, along partition mode `mode`; the rest is zeroed (masked later, adds nothing)."""
    for i in cutlass.range_constexpr(cute.size(tsX, mode=[mode])):
        if const_expr(mode == 1):
            if tcX[0, i, 0][axis] < n:
                cute.copy(load, tgX[None, i, None], tsX[None, i, None])
            else:
                tsX[None, i, None].fill(0)
        else:
            if tcX[0, 0, i][axis] < n:
                cute.copy(load, tgX[None, None, i], tsX[None, None, i])
            else:
                tsX[None, None, i].fill(0)


launch = AttentionSm90(causal=False)
