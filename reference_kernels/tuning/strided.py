"""Tuned tables of the strided template (a reduction over a middle or leading dim): read by
reference_kernels.strided and reference_kernels.leading at trace time. Each says why; the measurements are in docs/tuning.md."""

# Threads along R, by R: short reductions keep whole columns in one thread (no shared-memory
# step); long ones split so that a CTA's columns finish without one thread reading 4K rows.
# Past 512, 16 of 512: at 4 of 256 a sum over dim 1 of (16, 4096, 4096) bf16 had 128 CTAs, ran at
# 60% of copy (109 now), an amax over 16384 at 49 (108); H200
THREADS_R: tuple[tuple[int | None, int], ...] = ((64, 1), (512, 2), (None, 16))
NUM_THREADS: tuple[tuple[int | None, int], ...] = ((512, 256), (None, 512))
# Scalar loads (an odd inner dim: rows are not vector-aligned) want wide CTAs: a warp's load
# is only 128 bytes, and 1024 threads over 8 rows of R moved a 128 x 4096 x 4095 fp32 sum from
# 83% to 97% of the copy bandwidth on the H100 (evals/sweep_problem.py).
SCALAR_THREADS = 1024
THREADS_R_SCALAR: tuple[tuple[int | None, int], ...] = ((64, 1), (512, 4), (None, 8))
REGISTER_VALUES = 64  # values of a column share a rewriting thread holds (more costs residency)
# Past this R a held share loads 32 bits at least (a bf16 softmax over 256: 77% of copy, not 64;
# 512: 66, not 60), up to it narrower (64, 128: 87, 85, not 82); H200
NARROW_HOLD_MAX_R = 128

# The leading-dim variant (reference_kernels/leading.py: a reduction over the batch dim, R known
# only at run time, split over CTAs through a workspace).
# 132 SMs x 8 CTAs of 256 threads: the H100 full at once, as the whole-tensor template fills it
LEADING_TARGET_CTAS = 1056
LEADING_NUM_THREADS = 256
# Threads along R before R is split over CTAs, by the values a fold carries: up to 32 (a warp
# then still loads 8 columns of 16 bytes, whole 128-byte lines of four rows); 16 for a Chan merge
# (count, mean, m2), which folds a CTA's threads_r partials one after another at its end, a
# division each: at 32 that tail held a bf16 std over 32768 rows at 88.8% of copy (93.7% at 16,
# 94.6% at 8).
LEADING_MAX_THREADS_R: tuple[tuple[int | None, int], ...] = ((2, 32), (None, 16))
# CTAs along R at most: each adds a partial a column to the workspace and to the final fold
LEADING_MAX_SPLITS = 64
LEADING_FINAL_THREADS = 256
LEADING_MAX_WORKSPACE = 1 << 23  # fp32 elements: the kernel contract's limit (llmcompile.specs.contract)
