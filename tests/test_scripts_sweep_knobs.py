"""The knob sweep's table overrides (CPU): a variant's table replaces the module's for that
variant only, and the module's own comes back even when the variant fails to compile."""

from __future__ import annotations

import pytest

from evals.scripts import sweep_knobs
from reference_kernels.tuning import rmsnorm_bwd


def test_table_override_is_scoped_to_the_variant() -> None:
    before = rmsnorm_bwd.CTAS_PER_SM
    with sweep_knobs._tables({"tuning.rmsnorm_bwd.CTAS_PER_SM": [[None, 2]]}):
        assert rmsnorm_bwd.CTAS_PER_SM == ((None, 2),)
    assert rmsnorm_bwd.CTAS_PER_SM is before
    with pytest.raises(RuntimeError), sweep_knobs._tables({"tuning.rmsnorm_bwd.CTAS_PER_SM": [[1024, 8], [None, 1]]}):
        assert rmsnorm_bwd.CTAS_PER_SM == ((1024, 8), (None, 1))
        raise RuntimeError("does not compile")
    assert rmsnorm_bwd.CTAS_PER_SM is before


def test_a_number_replaces_a_module_constant() -> None:
    before = rmsnorm_bwd.SMEM_BUDGET
    with sweep_knobs._tables({"tuning.rmsnorm_bwd.SMEM_BUDGET": 229376}):
        assert rmsnorm_bwd.SMEM_BUDGET == 229376
    assert rmsnorm_bwd.SMEM_BUDGET == before


def test_unknown_table_is_an_error() -> None:
    with pytest.raises(AttributeError), sweep_knobs._tables({"rmsnorm_bwd.NO_SUCH_TABLE": [[None, 1]]}):
        pass


def test_attention_variant_keeps_causality_and_knobs() -> None:
    """A knob set for attention builds the attention kernel with those knobs, causal for the
    causal op (its entry takes causality beside the knobs, unlike the row kernels)."""
    from llmcompile.specs import get_op
    from reference_kernels.attention import AttentionKnobs

    for op, causal in (("attention", False), ("attention_causal_d64", True)):
        kernel = sweep_knobs._attention_entry(get_op(op), {"head_group": 0, "block_n": 64})
        assert kernel.causal is causal and kernel.knobs == AttentionKnobs(block_n=64, head_group=0)
        assert sweep_knobs._variant(get_op(op), {}).spec.name == op


def test_every_variant_is_checked_before_any_is_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Float64 checks lower the clocks for seconds: a sweep checks all variants, settles once,
    then times them and the baselines back to back (a variant timed right after its own check
    once read 14% low against a baseline timed after none)."""
    from types import SimpleNamespace

    from llmcompile.bench import baselines

    events: list[str] = []
    spec = SimpleNamespace(
        compute_bound=False, unit="TB/s", work=lambda m, n, d: 1e6, alloc_outputs=lambda *a: [], scalars={}
    )
    monkeypatch.setattr(sweep_knobs, "get_op", lambda op: spec)
    monkeypatch.setattr(sweep_knobs.timing, "copy_bandwidths", lambda *a, **k: {"torch": 3.0})
    monkeypatch.setattr(sweep_knobs, "input_sets", lambda *a, **k: [["x"]])
    monkeypatch.setattr(sweep_knobs, "_variant", lambda spec, fields: SimpleNamespace(compiled=lambda d, n: fields))
    monkeypatch.setattr(sweep_knobs, "_check", lambda spec, kernel, m, n, d: events.append(f"check {kernel}") or "ok")
    monkeypatch.setattr(sweep_knobs.timing, "settle", lambda *a: events.append("settle"))

    def time_calls(calls: list) -> SimpleNamespace:
        events.append("time")
        return SimpleNamespace(median_ms=1.0)

    monkeypatch.setattr(sweep_knobs.timing, "time_calls", time_calls)
    monkeypatch.setitem(baselines.BASELINES, "fake", lambda spec, s, scalars: lambda: None)
    assert sweep_knobs.main(["softmax", "bfloat16", "8x16", "{}", "fake", '{"num_threads": 64}']) == 0
    assert events == ["check {}", "check {'num_threads': 64}", "settle", "time", "time", "time"]


def test_a_variant_writes_every_input_set_into_one_output_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """As the public function and the baselines do (the allocator hands back the same freed
    block call after call), so a small row op's writes meet L2 alike for all of them."""
    from types import SimpleNamespace

    written: list[int] = []
    spec = SimpleNamespace(
        compute_bound=False, unit="TB/s", work=lambda m, n, d: 1e6, scalars={}, alloc_outputs=lambda *a: [object()]
    )
    monkeypatch.setattr(sweep_knobs, "get_op", lambda op: spec)
    monkeypatch.setattr(sweep_knobs.timing, "copy_bandwidths", lambda *a, **k: {"torch": 3.0})
    monkeypatch.setattr(sweep_knobs, "input_sets", lambda *a, **k: [["a"], ["b"], ["c"]])
    kernel = SimpleNamespace(compiled=lambda d, n: lambda x, out: written.append(id(out)))
    monkeypatch.setattr(sweep_knobs, "_variant", lambda spec, fields: kernel)
    monkeypatch.setattr(sweep_knobs, "_check", lambda *a: "ok")
    monkeypatch.setattr(sweep_knobs.timing, "settle", lambda *a: None)

    def time_calls(calls: list) -> SimpleNamespace:
        for c in calls:
            c()
        return SimpleNamespace(median_ms=1.0)

    monkeypatch.setattr(sweep_knobs.timing, "time_calls", time_calls)
    assert sweep_knobs.main(["softmax", "bfloat16", "8x16", "{}"]) == 0
    assert len(written) == 3 and len(set(written)) == 1
