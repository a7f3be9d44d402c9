"""Tuned table of the whole-tensor template (reference_kernels.total): read at trace time."""

# The fixed grid, by the values a fold carries: 132 SMs x 8 CTAs of 256 threads fill an H100 or
# H200 at once while a thread holds <= 32 registers. A Chan fold's (count, mean, m2) partials
# kernel holds 38: 6 CTAs an SM, so 1056 CTAs ran in 1.33 waves (a bf16 var, 91.9% of copy; 109.1
# at 792, a wave; H200).
CTAS: tuple[tuple[int | None, int], ...] = ((2, 1056), (None, 792))
