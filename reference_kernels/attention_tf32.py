"""Softmax attention forward in fp32 for wide heads (D up to 1024 and more) and short sequences
(N <= 512): the shape of KernelBench's 97_ScaledDotProductAttention (fp32, D = 1024, N = 512).

At D = 1024 a query tile's output (64 x 1024 fp32, 256 KB) does not fit in registers beside
anything, so flash attention's single pass does not apply; and the CuTe DSL offers no TF32
warpgroup MMA (its warpgroup ops are f16/bf16, fp8, int8), so the tensor cores are reached with
warp-level mma.sync. A CTA owns 64 queries of one head and works in two phases:

1. scores S = Q K^T for all N keys at once (64 x 512 fp32 in registers, 128 a thread), summed
   over D in 32-wide slices of Q and K staged by cp.async; then the exact softmax: each row's
   max and sum across the warps that share it, P = exp(S - max) written to shared memory.
2. O = P V in 256-wide slices of D (128 where D is not a multiple of 256): each slice's
   accumulator sums P against 32-key tiles of V staged by cp.async, is scaled by 1 / sum and
   stored.

Both GEMMs are mma.sync m16n8k8 in TF32, operands rounded to nearest (cvt.rna: the hardware's
own truncation would bias every product low by ~2^-12), accumulated in fp32. Over a softmax row
of 512 keys the rounding averages out: on 97's inputs the output is within 5e-5 of torch's fp32.
Shared tiles are padded (row strides of 36, N + 4 and 264 or 136 floats) so that every fragment
load of a warp hits 32 distinct banks.

Kernel contract entry: `launch(mQ, mK, mV, mO, scale, stream)`; mQ, mK, mV, mO (M, N, D) fp32,
contiguous, M the (batch x head) pairs; N a multiple of 64, at most 512; D a multiple of 128.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import cpasync, warp

from reference_kernels import reduce as R
from reference_kernels.attention_softmax import mma_rows_cols

OP = "attention"
BLOCK_M = 64  # queries a CTA
SLICE_K = 32  # D a stage of the score GEMM
KEYS_TILE = 32  # keys a stage of the output GEMM
# cp.async stages. 4 stages of 16-wide slices ran 97 6% slower than 2 of 32 (H100): the loads
# are not what waits, the shared-memory reads of the fragments are
STAGES = 2
# D an output accumulator: 256 where D allows (a warp's 32 x 64 tile reads 1.5 fragment
# words an MMA from shared memory, 32 x 32 reads 2)
SLICE_D = 256
MAX_KEYS = 512  # the scores of a thread's rows stay in registers: N / 4 floats
THREADS = 256
WARPS = THREADS // 32
PAD = 4  # floats added to each shared row, so a fragment's 8 rows x 4 columns land on 32 banks


def v_row(slice_d: int) -> int:
    """A V tile's row in floats: a B fragment reads 4 keys x 8 columns, and rows 136 (or 264)
    floats apart start 8 banks apart."""
    return slice_d + 2 * PAD


def slice_d(d: int) -> int:
    return SLICE_D if d % SLICE_D == 0 else SLICE_D // 2


def check_shape(n: int, d: int) -> str:
    """Why this kernel does not take (N, D), or ""."""
    if n % BLOCK_M or not 0 < n <= MAX_KEYS:
        return f"sequence length {n}: a multiple of {BLOCK_M}, at most {MAX_KEYS}"
    if d % (SLICE_D // 2):
        return f"head dim {d}: a multiple of {SLICE_D // 2}"
    return ""


def smem_floats(n: int, d: int) -> int:
    """Shared memory in floats: the larger phase's tiles, then the row statistics."""
    scores = STAGES * (BLOCK_M + n) * (SLICE_K + PAD)
    output = BLOCK_M * (n + PAD) + STAGES * KEYS_TILE * v_row(slice_d(d))
    return max(scores, output) + 2 * BLOCK_M * WARPS


@cute.jit
def _tf32(src: cute.Tensor, dst: cute.Tensor) -> None:
    """Fragment `dst` (TF32 registers) from fp32 `src`, rounded to nearest."""
    for i in cutlass.range_constexpr(cute.size(dst)):
        dst[i] = Int32(cute.arch.cvt_f32_tf32(src[i]))


class AttentionTf32:
    """`warps_m`: warps along the queries (the rest along the keys, and along D in phase 2). 1
    gives a warp 64 x 64 of the scores, 2 gives it 32 x 128: 1 reads fewer fragment words from
    shared memory an MMA (1 instead of 1.25) for 8 partial maxima and sums a row instead of 4.
    H100, 97 at its own size: 9.37 ms (1), 9.68 (2), 11.24 (4)."""

    def __init__(self, warps_m: int = 1) -> None:
        if warps_m not in (1, 2, 4):
            raise ValueError(f"warps_m={warps_m}: 1, 2 or 4")
        self.warps_m, self.warps_n = warps_m, WARPS // warps_m

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, scale: Float32, stream):
        self.n, self.d = mQ.shape[1], mQ.shape[2]
        why = check_shape(self.n, self.d)
        if const_expr(why):
            raise ValueError(why)
        vec = 128 // Float32.width
        # cp.async of 16 bytes: Q and K slices 8 threads a row, V tiles slice_d / 4 threads a row
        atom = cute.make_copy_atom(
            cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), Float32, num_bits_per_copy=128
        )
        per_row = SLICE_K // vec
        load_qk = cute.make_tiled_copy_tv(
            atom, cute.make_layout((THREADS // per_row, per_row), stride=(per_row, 1)), cute.make_layout((1, vec))
        )
        per_row = slice_d(self.d) // vec
        load_v = cute.make_tiled_copy_tv(
            atom, cute.make_layout((THREADS // per_row, per_row), stride=(per_row, 1)), cute.make_layout((1, vec))
        )
        mma = cute.make_tiled_mma(warp.MmaTF32Op((16, 8, 8)), (self.warps_m, self.warps_n, 1))
        m_blocks = self.n // BLOCK_M
        # one dim of CTAs, a head's query tiles consecutive: its K and V are read from L2 after the first
        grid = [mQ.shape[0] * m_blocks, 1, 1]
        self.kernel(mQ, mK, mV, mO, scale * R.LOG2_E, load_qk, load_v, mma).launch(
            grid=grid, block=[THREADS, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mO: cute.Tensor,
        scale_log2: Float32,
        load_qk: cute.TiledCopy,
        load_v: cute.TiledCopy,
        mma: cute.TiledMma,
    ):
        n, d = self.n, self.d
        sd = const_expr(slice_d(d))
        vr = const_expr(v_row(sd))
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        m_blocks = const_expr(n // BLOCK_M)
        head, m_block = bidx // m_blocks, bidx % m_blocks

        smem = cutlass.memory.SmemAllocator()
        base = smem.allocate_tensor(Float32, cute.make_layout(smem_floats(n, d)), byte_alignment=128).iterator
        q_rows, kv_rows = BLOCK_M * (SLICE_K + PAD), n * (SLICE_K + PAD)
        # phase 1: Q and K slices
        sQ = cute.make_tensor(base, cute.make_layout((BLOCK_M, SLICE_K, STAGES), stride=(SLICE_K + PAD, 1, q_rows)))
        sK = cute.make_tensor(
            base + STAGES * q_rows, cute.make_layout((n, SLICE_K, STAGES), stride=(SLICE_K + PAD, 1, kv_rows))
        )
        # phase 2, over the same bytes: P, and V tiles
        p_floats = BLOCK_M * (n + PAD)
        sP = cute.make_tensor(base, cute.make_layout((BLOCK_M, n), stride=(n + PAD, 1)))
        sV = cute.make_tensor(
            base + p_floats, cute.make_layout((KEYS_TILE, sd, STAGES), stride=(vr, 1, KEYS_TILE * vr))
        )
        stats = base + (smem_floats(n, d) - 2 * BLOCK_M * WARPS)
        sMax = cute.make_tensor(stats, cute.make_layout((BLOCK_M, self.warps_n), stride=(self.warps_n, 1)))
        sSum = cute.make_tensor(stats + BLOCK_M * WARPS, sMax.layout)

        gQ = cute.local_tile(mQ[head, None, None], (BLOCK_M, SLICE_K), (m_block, None))  # (64, 32, D/32)
        gK = cute.local_tile(mK[head, None, None], (n, SLICE_K), (0, None))  # (N, 32, D/32)
        gV = cute.local_tile(mV[head, None, None], (KEYS_TILE, sd), (None, None))  # (32, sd, N/32, D/sd)
        thr_qk, thr_v = load_qk.get_slice(tidx), load_v.get_slice(tidx)
        tQgQ, tQsQ = thr_qk.partition_S(gQ), thr_qk.partition_D(sQ)
        tKgK, tKsK = thr_qk.partition_S(gK), thr_qk.partition_D(sK)
        tVgV, tVsV = thr_v.partition_S(gV), thr_v.partition_D(sV)

        thr_mma = mma.get_slice(tidx)
        # ---- phase 1: S = Q K^T over D
        acc_S = cute.make_rmem_tensor(thr_mma.partition_shape_C((BLOCK_M, n)), Float32)
        acc_S.fill(0.0)
        rQ = thr_mma.make_fragment_A(thr_mma.partition_A(sQ[None, None, 0]))
        rK = thr_mma.make_fragment_B(thr_mma.partition_B(sK[None, None, 0]))
        slices = const_expr(d // SLICE_K)
        for k in cutlass.range_constexpr(STAGES - 1):
            if k < slices:
                cute.copy(load_qk, tQgQ[None, None, None, k], tQsQ[None, None, None, k])
                cute.copy(load_qk, tKgK[None, None, None, k], tKsK[None, None, None, k])
            cute.arch.cp_async_commit_group()  # (empty past the end: one group a slice, always)
        for k in cutlass.range(slices, unroll=1):
            cute.arch.cp_async_wait_group(STAGES - 2)
            cute.arch.barrier()  # slice k staged; slice k - 1 read by every warp, its stage free
            ahead = k + STAGES - 1
            if ahead < slices:
                cute.copy(load_qk, tQgQ[None, None, None, ahead], tQsQ[None, None, None, ahead % STAGES])
                cute.copy(load_qk, tKgK[None, None, None, ahead], tKsK[None, None, None, ahead % STAGES])
            cute.arch.cp_async_commit_group()
            tSsQ = thr_mma.partition_A(sQ[None, None, k % STAGES])
            tSsK = thr_mma.partition_B(sK[None, None, k % STAGES])
            for kk in cutlass.range_constexpr(cute.size(tSsQ, mode=[2])):
                _tf32(tSsQ[None, None, kk], rQ[None, None, kk])
                _tf32(tSsK[None, None, kk], rK[None, None, kk])
                cute.gemm(mma, acc_S, rQ[None, None, kk], rK[None, None, kk], acc_S)
        cute.arch.barrier()  # every warp done with Q and K: phase 2's tiles take their bytes

        tiles = const_expr(n // KEYS_TILE)
        steps = const_expr(tiles * (d // sd))
        for t in cutlass.range_constexpr(STAGES - 1):
            if t < steps:
                cute.copy(load_v, tVgV[None, None, None, t % tiles, t // tiles], tVsV[None, None, None, t])
            cute.arch.cp_async_commit_group()

        # ---- the softmax of whole rows: max and sum over the warps along the keys
        s = mma_rows_cols(acc_S)
        tScS = mma_rows_cols(thr_mma.partition_C(cute.make_identity_tensor((BLOCK_M, n))))
        col_warp = (tScS[0, 0][1] // 8) % self.warps_n  # an m16n8 atom a warp, warps along N side by side
        lane = cute.arch.lane_idx()
        rows = const_expr(cute.size(s, mode=[0]))
        for r in cutlass.range_constexpr(rows):
            (m,) = R.warp_reduce((s[r, None].load().reduce(cute.ReductionOp.MAX, Float32(-math.inf), 0),), R.fmax, 4)
            if lane % 4 == 0:
                sMax[tScS[r, 0][0], col_warp] = m
        cute.arch.barrier()
        inv = cute.make_rmem_tensor(rows, Float32)
        for r in cutlass.range_constexpr(rows):
            row = tScS[r, 0][0]
            m = sMax[row, 0]
            for w in cutlass.range_constexpr(1, self.warps_n):
                m = cute.arch.fmax(m, sMax[row, w])
            p = cute.math.exp2(s[r, None].load() * scale_log2 - m * scale_log2, fastmath=True)
            s[r, None] = p
            (part,) = R.warp_reduce((p.reduce(cute.ReductionOp.ADD, Float32(0.0), 0),), R.add, 4)
            if lane % 4 == 0:
                sSum[row, col_warp] = part
        cute.autovec_copy(acc_S, thr_mma.partition_C(sP))
        cute.arch.barrier()  # P and the partial sums visible to every warp
        for r in cutlass.range_constexpr(rows):
            row = tScS[r, 0][0]
            total = sSum[row, 0]
            for w in cutlass.range_constexpr(1, self.warps_n):
                total = total + sSum[row, w]
            inv[r] = cute.arch.rcp_approx(total)  # >= 1: the row's max contributes exp(0)

        # ---- phase 2: O = P V, a 128-wide slice of D at a time
        acc_O = cute.make_rmem_tensor(thr_mma.partition_shape_C((BLOCK_M, sd)), Float32)
        sVt0 = cute.make_tensor(sV.iterator, cute.make_layout((sd, KEYS_TILE), stride=(1, vr)))
        rP = thr_mma.make_fragment_A(thr_mma.partition_A(cute.local_tile(sP, (BLOCK_M, KEYS_TILE), (0, 0))))
        rV = thr_mma.make_fragment_B(thr_mma.partition_B(sVt0))
        for t in cutlass.range(steps, unroll=1):
            c = t // tiles
            j = t - c * tiles
            cute.arch.cp_async_wait_group(STAGES - 2)
            cute.arch.barrier()  # V tile t staged; tile t - 1 read by every warp
            ahead = t + STAGES - 1
            if ahead < steps:
                c1 = ahead // tiles
                cute.copy(
                    load_v, tVgV[None, None, None, ahead - c1 * tiles, c1], tVsV[None, None, None, ahead % STAGES]
                )
            cute.arch.cp_async_commit_group()
            if j == 0:
                acc_O.fill(0.0)
            tOsP = thr_mma.partition_A(cute.local_tile(sP, (BLOCK_M, KEYS_TILE), (0, j)))
            sVt = cute.make_tensor(sV.iterator + (t % STAGES) * (KEYS_TILE * vr), sVt0.layout)
            tOsV = thr_mma.partition_B(sVt)
            for kk in cutlass.range_constexpr(cute.size(tOsP, mode=[2])):
                _tf32(tOsP[None, None, kk], rP[None, None, kk])
                _tf32(tOsV[None, None, kk], rV[None, None, kk])
                cute.gemm(mma, acc_O, rP[None, None, kk], rV[None, None, kk], acc_O)
            if j == tiles - 1:
                o = mma_rows_cols(acc_O)
                for r in cutlass.range_constexpr(rows):
                    o[r, None] = o[r, None].load() * inv[r]
                gO = cute.local_tile(mO[head, None, None], (BLOCK_M, sd), (m_block, c))
                cute.autovec_copy(acc_O, thr_mma.partition_C(gO))


launch = AttentionTf32()
