"""Tuned tables of the grouped-normalization template (reference_kernels.norm): read at trace time.
Measured on an H200 with `evals/scripts/sweep_problem` over rows of torch.randn, 1 GiB a problem,
a value a row (docs/tuning.md, norm.*)."""

# A value a group of at most this many bytes: a thread a group (`packed`). A CTA a group left
# most of its threads idle: logsumexp of 16 fp32 a row 0.8% of copy -> 110.1, of 128 fp32 5.9 ->
# 68.5, of 256 fp32 42.5 (32 threads a CTA) -> 70.9; a sum of 256 bf16 21.2 -> 70.1.
PACKED_BYTES = 1024

# Threads of a CTA a group (the fused path) for a value a group, by the group's bytes: a thread
# one batch of loads (unroll x 16 bytes), as in a bigger group's first step. 256 threads for 512
# fp32 gave 23.0% of copy, 32 gave 83.7; 1024 fp32 44.9 at 256, 113.9 at 64; 2048 fp32 77.4 at 256,
# 112.4 at 128; from 4096 fp32 every count from 32 to 256 gave 114-115. A Chan merge (a var, a
# std) too: x.var(-1) of 1024 bf16 25.7 at 256 -> 83.5, x.std(-1) of 2048 fp32 101.6 -> 112.2.
FUSED_THREADS: tuple[tuple[int | None, int], ...] = ((2048, 32), (4096, 64), (8192, 128), (None, 256))
