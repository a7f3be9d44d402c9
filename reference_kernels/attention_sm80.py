"""Softmax attention forward with the Ampere structure, one (batch x head) row at a time:
cp.async tiles, warp-level mma.sync 16x8x16 with ldmatrix, 8 warps of 16 queries. The first
attention kernel of this project; `attention.py` (TMA, WGMMA, warp specialisation) replaced it
as the reference on Hopper (about 1.9x faster on the H100). It stays as the offline search's
candidate for GPUs without warpgroup MMA and as the simpler kernel to read first.

Kernel contract entry: `launch(mQ, mK, mV, mO, mLse, scale, stream)`; mQ, mK, mV, mO (M, N, D)
with M the (batch x head) pairs, N the sequence length, D the head dim (a multiple of 32,
<= 128); mLse (M, N) fp32; bf16 or fp16.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, const_expr
from cutlass.cute.nvgpu import cpasync, warp

from reference_kernels import reduce as R
from reference_kernels.attention_softmax import mma_rows_cols, normalize_rows, online_softmax

OP = "attention"
COPY_BITS = 128


@dataclass(frozen=True)
class AttentionSm80Knobs:
    """Tile sizes. A warp owns 16 query rows, so block_m sets the CTA's threads. The default:
    8 warps of 16 rows, 64 keys a tile, which keeps the scores (32 fp32 a thread) and the
    output (64 at D = 128) in registers together (211 registers, no spills)."""

    block_m: int = 128
    block_n: int = 64

    @property
    def num_threads(self) -> int:
        return self.block_m // 16 * 32


def _as_operand_a(p: cute.Tensor) -> cute.Tensor:
    """Scores converted to the input dtype, ((2, 2), MMA_M, MMA_N) as the A operand of the
    second GEMM, ((2, 2, 2), MMA_M, MMA_N / 2): two n8 atoms of C are one k16 atom of A."""
    split = cute.logical_divide(p.layout, (None, None, 2))
    layout = cute.make_layout(
        ((split.shape[0], split.shape[2][0]), split.shape[1], split.shape[2][1]),
        stride=((split.stride[0], split.stride[2][0]), split.stride[1], split.stride[2][1]),
    )
    return cute.make_tensor(p.iterator, layout)


class AttentionSm80:
    def __init__(self, causal: bool = False, knobs: AttentionSm80Knobs = AttentionSm80Knobs()) -> None:
        self.causal = causal
        self.knobs = knobs
        self.bm, self.bn, self.threads = knobs.block_m, knobs.block_n, knobs.num_threads

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
        if const_expr(self.d % 32 or self.d > 128):
            raise ValueError(f"head dim {self.d}: a multiple of 32, at most 128")
        self.n = mQ.shape[1]
        # Shared tiles in 64-element (128-byte) rows, swizzled so that ldmatrix's eight rows of
        # 16 bytes land on distinct banks.
        kblock = 64 if self.d % 64 == 0 else 32
        atom = cute.make_composed_layout(
            cute.make_swizzle(3 if kblock == 64 else 2, 3, 3), 0, cute.make_layout((8, kblock), stride=(kblock, 1))
        )
        sQ_layout = cute.tile_to_shape(atom, (self.bm, self.d), (0, 1))
        sKV_layout = cute.tile_to_shape(atom, (self.bn, self.d), (0, 1))
        vec = COPY_BITS // dtype.width
        threads_k = kblock // vec
        thr = cute.make_layout((self.threads // threads_k, threads_k), stride=(threads_k, 1))
        load = cute.make_tiled_copy_tv(
            cute.make_copy_atom(
                cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), dtype, num_bits_per_copy=COPY_BITS
            ),
            thr,
            cute.make_layout((1, vec)),
        )
        store = cute.make_tiled_copy_tv(
            cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=COPY_BITS),
            thr,
            cute.make_layout((1, vec)),
        )
        warps = self.threads // R.WARP
        mma = cute.make_tiled_mma(
            warp.MmaF16BF16Op(dtype, Float32, (16, 8, 16)), (warps, 1, 1), permutation_mnk=(warps * 16, 16, 16)
        )
        grid = [cute.ceil_div(self.n, self.bm), mQ.shape[0], 1]
        scale_log2 = scale * R.LOG2_E
        self.kernel(mQ, mK, mV, mO, mLse, scale, scale_log2, sQ_layout, sKV_layout, load, store, mma).launch(
            grid=grid, block=[self.threads, 1, 1], stream=stream
        )

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
        sQ_layout: cute.ComposedLayout,
        sKV_layout: cute.ComposedLayout,
        load: cute.TiledCopy,
        store: cute.TiledCopy,
        mma: cute.TiledMma,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        m_block, head, _ = cute.arch.block_idx()
        dtype = mQ.element_type
        n_blocks = cute.ceil_div(self.n, self.bn)
        if const_expr(self.causal):
            # (keys past the tile's last query are masked for every query of it)
            n_blocks = cutlass.min(cute.ceil_div((m_block + 1) * self.bm, self.bn), n_blocks)

        smem = cutlass.memory.SmemAllocator()
        sQ = smem.allocate_tensor(dtype, sQ_layout, byte_alignment=1024)
        sK = smem.allocate_tensor(dtype, sKV_layout, byte_alignment=1024)
        sV = smem.allocate_tensor(dtype, sKV_layout, byte_alignment=1024)
        # V as the second GEMM's B operand: (D, keys)
        sVt = cute.composition(sV, cute.make_layout((self.d, self.bn), stride=(self.bn, 1)))

        gQ = cute.local_tile(mQ[head, None, None], (self.bm, self.d), (m_block, 0))
        gK = cute.local_tile(mK[head, None, None], (self.bn, self.d), (None, 0))
        gV = cute.local_tile(mV[head, None, None], (self.bn, self.d), (None, 0))
        cQ = cute.local_tile(cute.make_identity_tensor((self.n, self.d)), (self.bm, self.d), (m_block, 0))
        cKV = cute.local_tile(cute.make_identity_tensor((self.n, self.d)), (self.bn, self.d), (None, 0))

        thr_load = load.get_slice(tidx)
        tQgQ, tQsQ, tQcQ = thr_load.partition_S(gQ), thr_load.partition_D(sQ), thr_load.partition_S(cQ)
        tKgK, tKsK = thr_load.partition_S(gK), thr_load.partition_D(sK)
        tVgV, tVsV = thr_load.partition_S(gV), thr_load.partition_D(sV)
        tKVcKV = thr_load.partition_S(cKV)

        _load_rows(load, tQgQ, tQsQ, tQcQ, self.n)
        _load_rows(load, tKgK[None, None, None, 0], tKsK, tKVcKV[None, None, None, 0], self.n)
        cute.arch.cp_async_commit_group()

        thr_mma = mma.get_slice(tidx)
        tSrQ = thr_mma.make_fragment_A(thr_mma.partition_A(sQ))
        tSrK = thr_mma.make_fragment_B(thr_mma.partition_B(sK))
        tOrVt = thr_mma.make_fragment_B(thr_mma.partition_B(sVt))
        acc_O = cute.make_rmem_tensor(thr_mma.partition_shape_C((self.bm, self.d)), Float32)
        acc_O.fill(0.0)
        ldsm = warp.LdMatrix8x8x16bOp
        copy_Q = cute.make_tiled_copy_A(cute.make_copy_atom(ldsm(transpose=False, num_matrices=4), dtype), mma)
        copy_K = cute.make_tiled_copy_B(cute.make_copy_atom(ldsm(transpose=False, num_matrices=4), dtype), mma)
        copy_V = cute.make_tiled_copy_B(cute.make_copy_atom(ldsm(transpose=True, num_matrices=4), dtype), mma)
        tSsQ, tSrQ_view = copy_Q.get_slice(tidx).partition_S(sQ), copy_Q.get_slice(tidx).retile(tSrQ)
        tSsK, tSrK_view = copy_K.get_slice(tidx).partition_S(sK), copy_K.get_slice(tidx).retile(tSrK)
        tOsVt, tOrVt_view = copy_V.get_slice(tidx).partition_S(sVt), copy_V.get_slice(tidx).retile(tOrVt)

        # Each thread's rows of the query tile (for the mask, lse and the output's predicate)
        cS = cute.local_tile(cute.make_identity_tensor((self.n, self.n)), (self.bm, self.bn), (m_block, 0))
        tScS = mma_rows_cols(thr_mma.partition_C(cS))
        rows = cute.size(tScS, mode=[0])
        row_max = cute.make_rmem_tensor(rows, Float32)
        row_sum = cute.make_rmem_tensor(rows, Float32)
        row_max.fill(-math.inf)
        row_sum.fill(0.0)

        for j in cutlass.range(n_blocks, unroll=1):
            cute.arch.cp_async_wait_group(0)
            cute.arch.barrier()  # K_j (and, the first time, Q) staged; V_{j-1} read by every warp
            if j == 0:
                cute.copy(copy_Q, tSsQ, tSrQ_view)  # Q stays in registers for every key tile
            _load_rows(load, tVgV[None, None, None, j], tVsV, tKVcKV[None, None, None, j], self.n)
            cute.arch.cp_async_commit_group()

            acc_S = cute.make_rmem_tensor(thr_mma.partition_shape_C((self.bm, self.bn)), Float32)
            acc_S.fill(0.0)
            for k in cutlass.range_constexpr(cute.size(tSsK, mode=[2])):
                cute.copy(copy_K, tSsK[None, None, k], tSrK_view[None, None, k])
                cute.gemm(mma, acc_S, tSrQ[None, None, k], tSrK[None, None, k], acc_S)

            cute.arch.cp_async_wait_group(0)
            cute.arch.barrier()  # V_j staged; K_j read by every warp
            if j + 1 < n_blocks:
                _load_rows(load, tKgK[None, None, None, j + 1], tKsK, tKVcKV[None, None, None, j + 1], self.n)
                cute.arch.cp_async_commit_group()

            s, o = mma_rows_cols(acc_S), mma_rows_cols(acc_O)
            online_softmax(s, o, row_max, row_sum, tScS, j, m_block, scale_log2, self.bm, self.bn, self.n, self.causal)
            rP = cute.make_rmem_tensor_like(acc_S, dtype)
            rP.store(acc_S.load().to(dtype))
            tOrP = _as_operand_a(rP)
            for k in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
                cute.copy(copy_V, tOsVt[None, None, k], tOrVt_view[None, None, k])
                cute.gemm(mma, acc_O, tOrP[None, None, k], tOrVt[None, None, k], acc_O)

        self.epilogue(mO, mLse, acc_O, row_max, row_sum, tScS, sQ, store, mma, tidx, m_block, head, scale)

    @cute.jit
    def epilogue(self, mO, mLse, acc_O, row_max, row_sum, tScS, sQ, store, mma, tidx, m_block, head, scale: Float32):
        """o = acc / sum (0 for a row with no key), staged through shared memory for 16-byte
        stores; lse = max * scale + log(sum), written by the first lane of each quad."""
        normalize_rows(mma_rows_cols(acc_O), row_max, row_sum, tScS, mLse, head, self.n, scale)
        rO = cute.make_rmem_tensor_like(acc_O, mO.element_type)
        rO.store(acc_O.load().to(mO.element_type))
        sO = cute.make_tensor(sQ.iterator, sQ.layout)  # (every warp read its Q before the last tile)
        copy_C = cute.make_tiled_copy_C(cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), mO.element_type), mma)
        cute.copy(copy_C, copy_C.get_slice(tidx).retile(rO), copy_C.get_slice(tidx).partition_D(sO))
        cute.arch.barrier()
        gO = cute.local_tile(mO[head, None, None], (self.bm, self.d), (m_block, 0))
        cO = cute.local_tile(cute.make_identity_tensor((self.n, self.d)), (self.bm, self.d), (m_block, 0))
        thr = store.get_slice(tidx)
        tOsO, tOgO, tOcO = thr.partition_S(sO), thr.partition_D(gO), thr.partition_D(cO)
        tOrO = cute.make_rmem_tensor_like(tOgO, mO.element_type)
        cute.copy(store, tOsO, tOrO)
        for i in cutlass.range_constexpr(cute.size(tOrO, mode=[1])):
            if tOcO[0, i, 0][0] < self.n:
                cute.copy(store, tOrO[None, i, None], tOgO[None, i, None])


@cute.jit
def _load_rows(load: cute.TiledCopy, tgX: cute.Tensor, tsX: cute.Tensor, tcX: cute.Tensor, n: cutlass.Constexpr):
    """cp.async a tile's rows that lie inside the sequence; rows past it are zeroed, so their
    scores are finite (masked later) and their values add nothing."""
    for i in cutlass.range_constexpr(cute.size(tsX, mode=[1])):
        if tcX[0, i, 0][0] < n:
            cute.copy(load, tgX[None, i, None], tsX[None, i, None])
        else:
            tsX[None, i, None].fill(0)


launch = AttentionSm80(causal=False)
