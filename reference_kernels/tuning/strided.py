"""Tuned tables of the strided template (a reduction over a middle or leading dim): read by
reference_kernels.strided at trace time. Each says why; the measurements are in docs/tuning.md."""

# Threads along R, by R: short reductions keep whole columns in one thread (no shared-memory
# step); long ones split so that a CTA's columns finish without one thread reading 4K rows.
THREADS_R: tuple[tuple[int | None, int], ...] = ((64, 1), (512, 2), (None, 4))
# Scalar loads (an odd inner dim: rows are not vector-aligned) want wide CTAs: a warp's load
# is only 128 bytes, and 1024 threads over 8 rows of R moved a 128 x 4096 x 4095 fp32 sum from
# 83% to 97% of the copy bandwidth on the H100 (evals/sweep_problem.py).
SCALAR_THREADS = 1024
THREADS_R_SCALAR: tuple[tuple[int | None, int], ...] = ((64, 1), (512, 4), (None, 8))
REGISTER_VALUES = 64  # values of a column share a rewriting thread holds (more costs residency)
