"""Tuned tables of the softmax forward (and log_softmax, built on it): read by
reference_kernels.softmax at trace time. Each says why; the measurements are in docs/tuning.md."""

# Rows staged through shared memory (1) or loaded directly (0), by N: staging pays even on
# clustered rows, but not where the staged tile is large. Measurements: docs/tuning.md, softmax.STAGE_SMEM.
STAGE_SMEM: tuple[tuple[int | None, int], ...] = ((65536, 1), (None, 0))
