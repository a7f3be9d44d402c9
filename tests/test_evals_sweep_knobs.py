"""The knob sweep's table overrides (CPU): a variant's table replaces the module's for that
variant only, and the module's own comes back even when the variant fails to compile."""

from __future__ import annotations

import pytest

from evals import sweep_knobs
from reference_kernels import rmsnorm_bwd


def test_table_override_is_scoped_to_the_variant() -> None:
    before = rmsnorm_bwd.CTAS_PER_SM
    with sweep_knobs._tables({"rmsnorm_bwd.CTAS_PER_SM": [[None, 2]]}):
        assert rmsnorm_bwd.CTAS_PER_SM == ((None, 2),)
    assert rmsnorm_bwd.CTAS_PER_SM is before
    with pytest.raises(RuntimeError), sweep_knobs._tables({"rmsnorm_bwd.CTAS_PER_SM": [[1024, 8], [None, 1]]}):
        assert rmsnorm_bwd.CTAS_PER_SM == ((1024, 8), (None, 1))
        raise RuntimeError("does not compile")
    assert rmsnorm_bwd.CTAS_PER_SM is before


def test_unknown_table_is_an_error() -> None:
    with pytest.raises(AttributeError), sweep_knobs._tables({"rmsnorm_bwd.NO_SUCH_TABLE": [[None, 1]]}):
        pass


def test_attention_variant_keeps_causality_and_knobs() -> None:
    """A knob set for attention builds the attention kernel with those knobs, causal for the
    causal op (its entry takes causality beside the knobs, unlike the row kernels)."""
    from llmcompile.ops import get_op
    from reference_kernels.attention import AttentionKnobs

    for op, causal in (("attention", False), ("attention_causal_d64", True)):
        kernel = sweep_knobs._attention_entry(get_op(op), {"head_group": 0, "block_n": 64})
        assert kernel.causal is causal and kernel.knobs == AttentionKnobs(block_n=64, head_group=0)
        assert sweep_knobs._variant(get_op(op), {}).spec.name == op
