"""Tuned tables of the cross-entropy forward (loss, lse, fused dlogits): read by
reference_kernels.cross_entropy at trace time. Each says why; the measurements are in
docs/tuning.md."""

# Where a row's target logit comes from, by N: "load" (the leader reads it while the row is in
# flight: short rows), "smem" (from the staged row), "registers" (the thread holding that column:
# long rows, where the leader's chain would hold up the reduction). Measurements: docs/tuning.md,
# cross_entropy.TARGET_LOGIT.
TARGET_LOGIT: tuple[tuple[int | None, str], ...] = ((256, "load"), (3072, "smem"), (None, "registers"))
# Where dlogits' softmax probabilities come from (cross_entropy_fused), by N: "kept", the
# reduction's own exp(x - max) / sum, held across it; "again", exp(x - lse) after it.
# Measurements: docs/tuning.md, cross_entropy.PROBABILITIES.
PROBABILITIES: tuple[tuple[int | None, str], ...] = ((None, "kept"),)
# With dlogits, every thread of a row reads its target index (each may hold the target column);
# where the loss's target logit comes from is TARGET_LOGIT's choice again, by these tables (16-bit
# and 32-bit x; modes as there). "registers" takes the holder through a branch of its values, a few
# dozen instructions a row that one lane of 32 runs. Measurements: docs/tuning.md,
# cross_entropy.FUSED_TARGET_LOGIT.
FUSED_TARGET_LOGIT: tuple[tuple[int | None, str], ...] = ((256, "load"), (3072, "smem"), (None, "registers"))
FUSED_TARGET_LOGIT_32BIT: tuple[tuple[int | None, str], ...] = ((3072, "smem"), (None, "registers"))
# How dlogits take 1 off the target column, by N: "holder", the thread holding it alone, in a
# branch; "every", each value a select, no branch (three operations a value, where the holder's
# branch is one lane's). Registers, holder / every: bf16 4096x65536 2.978 / 2.927, 16384x8192
# 2.961 / 2.952; within 0.5% at 2048 and past 65536.
ONEHOT: tuple[tuple[int | None, str], ...] = ((3072, "every"), (None, "holder"))

# Where the row's exponentials take the one-FFMA form (reduce.exp_offset), by N and output:
# "fma" where it measured faster, "sub" elsewhere. Measurements: docs/tuning.md, cross_entropy.EXP_OFFSET.
EXP_OFFSET: tuple[tuple[int | None, str], ...] = ((512, "fma"), (None, "sub"))
EXP_OFFSET_LSE: tuple[tuple[int | None, str], ...] = ((256, "sub"), (512, "fma"), (None, "sub"))
EXP_OFFSET_FUSED: tuple[tuple[int | None, str], ...] = ((None, "sub"),)

# How the row leader reads its target index where the logit comes from the staged row, by N (16-bit
# and 32-bit x). Measurements: docs/tuning.md, cross_entropy.INDEX_LOAD.
INDEX_LOAD: tuple[tuple[int | None, str], ...] = ((256, "plain"), (512, "staged"), (None, "plain"))
INDEX_LOAD_32BIT: tuple[tuple[int | None, str], ...] = ((None, "plain"),)

# The loss's total (cross_entropy_total, _fused_total) in one launch, not two, for inputs of at most
# this many bytes of logits: (threads of its one CTA, bytes). Such a call costs its host time alone,
# a launch of which was a third (the finish's); one CTA of 512 threads reads 32 KB in less time.
# Measurements: evals/results/host-time.
ONE_CTA: tuple[int, int] = (512, 32768)
