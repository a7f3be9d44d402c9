"""Tuned tables of the Hopper attention kernel: read by reference_kernels.attention at trace time.
Each says why; the measurements are in docs/tuning.md."""

# Causal: heads whose tiles interleave, longest first across them, by N. Measurements:
# docs/tuning.md, attention.CAUSAL_HEAD_GROUP.
CAUSAL_HEAD_GROUP = ((2048, 8), (None, 4))
L2_BYTES = 50 << 20  # the H100's L2 (and the H200's): K and V of a head group should fit
