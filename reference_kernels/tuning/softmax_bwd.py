"""Tuned tables of the softmax and log_softmax backward: read by reference_kernels.softmax_bwd at
trace time. Each says why; the measurements are in docs/tuning.md."""

# When log_softmax_bwd takes exp(y), by N: "before" the row reduction on long rows, so the
# exponentials run while it waits on the other warps and CTAs. Measurements: docs/tuning.md,
# softmax_bwd.LOG_EXP.
LOG_EXP: tuple[tuple[int | None, str], ...] = ((16384, "after"), (None, "before"))
