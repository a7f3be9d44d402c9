"""Tuned tables of the RMSNorm backward, and the LayerNorm backward built on it: read by
reference_kernels.rmsnorm_bwd at trace time. Each says why; the measurements are in
docs/tuning.md."""

NUM_SMS = 132  # H100 SXM and H200
# Row-tile CTAs (each of `cluster_n` CTAs) the grid keeps per SM, by N: enough rows in flight to
# cover memory latency, few enough that the partial rows stay small beside the rows. Measurements:
# docs/tuning.md, rmsnorm_bwd.CTAS_PER_SM.
CTAS_PER_SM: tuple[tuple[int | None, int], ...] = ((512, 8), (2048, 4), (16384, 2), (None, 4))
CTAS_PER_SM_32BIT: tuple[tuple[int | None, int], ...] = ((1024, 4), (16384, 2), (None, 4))
# Threads per row: one vector of 8 (16-bit) a thread up to N = 4096, as the forward's table would
# give a row with twice the registers behind each value (see ROW_ARRAYS). Measurements:
# docs/tuning.md, rmsnorm_bwd.THREADS_PER_ROW.
THREADS_PER_ROW: tuple[tuple[int | None, int], ...] = (
    (256, 32), (512, 64), (1024, 128), (2048, 256), (8192, 256), (None, 512)
)  # fmt: skip
# Row-shaped arrays a thread is budgeted for (reduce.resolve_tiling's `arrays`), by N: staged rows
# are read twice, so a thread holds the fp32 column sums and w across the reduction; past 16K w
# comes from shared memory (WEIGHT_IN). Measurements: docs/tuning.md, rmsnorm_bwd.ROW_ARRAYS.
ROW_ARRAYS: tuple[tuple[int | None, int], ...] = ((16384, 8), (32768, 4), (131072, 8), (None, 4))
WEIGHT_IN: tuple[tuple[int | None, str], ...] = ((16384, "early"), (None, "smem"))
# 16-bit rows staged in shared memory (1) or held in registers (0), by N. Measurements:
# docs/tuning.md, rmsnorm_bwd.STAGE_16BIT.
STAGE_16BIT: tuple[tuple[int | None, int], ...] = ((4096, 1), (8192, 0), (None, 1))
# Row tiles a staged CTA keeps in shared memory at once, by N, for 16-bit and for 32-bit rows: at
# 2 the next tile's copy is in flight through the whole reduction, for twice the staging.
# Measurements: docs/tuning.md, rmsnorm_bwd.STAGING_DEPTH.
STAGING_DEPTH: tuple[tuple[int | None, int], ...] = ((16384, 2), (32768, 1), (None, 2))
STAGING_DEPTH_32BIT: tuple[tuple[int | None, int], ...] = ((16384, 1), (131072, 2), (None, 1))
# The final column sums: a CTA of up to MAX_FINISH_WARPS warps takes 32 columns, warp w summing
# partial rows w, w + warps, ...: the partial rows' loads spread over as many threads as there
# are rows to read (1056 rows at N <= 1024: 33 loads a thread, 8 in flight at once).
MAX_FINISH_WARPS = 32
# Shared memory a CTA may plan for (sm_90's 227 KiB less room for the reduction scratch and
# barriers). A staged fp32 row past ~150K columns at cluster 8 needs more (x, dy and w: 240
# KiB at N = 151936, which CUDA refuses to launch): the row goes to a larger cluster first,
# then w is read from L2 each tile, then the rows are held in registers.
SMEM_BUDGET = 220 * 1024
# The cluster is widened until two CTAs fit an SM, where it can be: H100 4096x65536 fp32 (x, dy
# and w 192 KiB a CTA at cluster 4, 96 KiB at 8), 4 CTAs a SM in the grid, TB/s at cluster 4 /
# 8: rmsnorm 2.46/2.68, layernorm 1.84/2.31 (QuACK 2.79, 2.66).
SMEM_TWO_A_SM = SMEM_BUDGET // 2
# Whether a clustered, staged row's loop sends tile i + 1's row sums before it waits on tile i's
# (NormBackward.overlapped_rows), by N (0: one tile's reduction at a time). Measurements:
# docs/tuning.md, rmsnorm_bwd.OVERLAP.
OVERLAP: tuple[tuple[int | None, int], ...] = ((32768, 0), (None, 1))
OVERLAP_STAGES = 4  # reduction stages the overlapped loop needs (see R.row_reduce_send)
# With the folded sends (CLUSTER_SEND "cta"), the overlap is taken where its three staged tiles,
# w and scratch fit what a CTA may have (sm_90: 227 KiB), less room for the barriers and the
# allocator's alignment. The warps' sends keep the rule the overlap was measured under
# (SMEM_BUDGET and the tiling's own stages' room): the exact one would also take it at N it has
# not run at (16-bit N of 50K-57K at cluster 4, 32-bit of 72K-81K at cluster 8, ...).
SMEM_PER_CTA = 232448 - 1024
# How a clustered row's sums reach its peers, by N: "warps", each warp sends its own to every
# peer; "cta", the CTA folds them first and one warp sends (fewer stores, one more barrier).
# Measurements: docs/tuning.md, rmsnorm_bwd.CLUSTER_SEND.
CLUSTER_SEND: tuple[tuple[int | None, str], ...] = ((None, "warps"),)
CLUSTER_SEND_32BIT: tuple[tuple[int | None, str], ...] = ((131072, "warps"), (None, "cta"))
# Where dx reads a staged row's x and dy from, by N: "smem", read again from shared memory
# after the row reduction; "registers", held across it from the first read, as QuACK's Hopper
# backward does up to 16K (one CTA of 128 threads a row at 4096, 32 values a thread). Held, a
# tile's buffer is free once read, and the tile that refills it goes out before the reduction
# rather than after dx. Not in the overlapped loop. Not yet measured: "smem" everywhere. (Read
# again from global memory instead, where the tile has just been, the 256K rows spilled 300-536 B.)
SECOND_READ: tuple[tuple[int | None, str], ...] = ((None, "smem"),)
# How a bf16 row's x, dy and w become fp32 in registers, by N (reduce.widen): "cvt", a conversion a
# value; "bits", two bit operations a pair of values, a third fewer instructions. Measurements:
# docs/tuning.md, rmsnorm_bwd.WIDEN_BF16.
WIDEN_BF16: tuple[tuple[int | None, str], ...] = ((None, "cvt"),)
# Which forms of a row's arithmetic the kernel takes, by N (each op its own table): "dx", dx in
# two FMAs a value on the row's constants (dx_of_rows); "xhat", xhat in one FMA (LayerNorm);
# "sums", no branch around a one-row tile's column sums (accumulate). Fewer operations are not
# faster everywhere: ptxas schedules the loop differently at each N. Measurements: docs/tuning.md,
# rmsnorm_bwd.ARITHMETIC_16BIT.
ARITHMETIC_16BIT: tuple[tuple[int | None, tuple[str, ...]], ...] = ((131072, ()), (None, ("dx", "sums")))
ARITHMETIC_32BIT: tuple[tuple[int | None, tuple[str, ...]], ...] = ((None, ()),)
# How many parts a staged tile's copies are issued in and its two passes read it in, by N (one
# commit group a part and tensor; a thread's vectors split in equal runs, reduce.chunk_of).
# Measurements: docs/tuning.md, rmsnorm_bwd.TILE_CHUNKS.
TILE_CHUNKS: tuple[tuple[int | None, int], ...] = ((None, 1),)
# How a staged tile's second pass refills its buffers where one tile is staged (STAGING_DEPTH 1), by
# N, for 16-bit and for 32-bit rows. Measurements: docs/tuning.md, rmsnorm_bwd.REFILL_PARTS.
REFILL_PARTS: tuple[tuple[int | None, int], ...] = ((16384, 0), (32768, 2), (None, 0))
REFILL_PARTS_32BIT: tuple[tuple[int | None, int], ...] = ((131072, 0), (None, 8))
# Knob sets for 16-bit rows, by N (RowKnobs fields, taken whole: reduce.fill_knobs). Measurements:
# docs/tuning.md, rmsnorm_bwd.KNOBS_16BIT.
KNOBS_16BIT: tuple[tuple[int | None, dict], ...] = (
    (2048, {}), (4096, {"threads_per_row": 128, "num_threads": 128, "cluster_n": 1}), (None, {})
)  # fmt: skip
# Clusters the grid keeps at most, by cluster_n (0: no cap past the CTAS_PER_SM one). Measurements:
# docs/tuning.md, rmsnorm_bwd.CLUSTERS_AT_ONCE.
CLUSTERS_AT_ONCE: tuple[tuple[int | None, int], ...] = ((4, 0), (8, 14), (None, 7))
