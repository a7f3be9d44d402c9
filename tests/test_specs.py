from __future__ import annotations

import pytest
import torch

from llmcompile.specs import BUILTIN, OpError, bench_shapes, dtype_name, get_op, verify_shapes


def test_unknown_op_names_the_known_ones() -> None:
    with pytest.raises(
        OpError,
        match="unknown op .sofmax.; known ops: attention, attention_causal, attention_causal_d64, attention_d64, copy, cross_entropy,",
    ):
        get_op("sofmax")


def test_dtype_aliases_and_errors() -> None:
    assert dtype_name("bf16") == "bfloat16"
    assert dtype_name(torch.float16) == "float16"
    with pytest.raises(OpError, match="not supported"):
        dtype_name("int8")


def test_byte_model_counts_each_tensor_once() -> None:
    assert get_op("softmax").bytes_moved(4, 1024, "bfloat16") == 2 * 4 * 1024 * 2
    assert get_op("rmsnorm").bytes_moved(4, 1024, "float32") == (2 * 4 * 1024 + 1024) * 4
    # logits, int64 targets, fp32 losses
    assert get_op("cross_entropy").bytes_moved(4, 1024, "bfloat16") == 4 * 1024 * 2 + 4 * 8 + 4 * 4


def test_bench_grid_is_2_to_the_28_elements() -> None:
    assert all(m * n == 1 << 28 for m, n in bench_shapes())


def test_problem_limits_are_clear() -> None:
    spec = get_op("softmax")
    with pytest.raises(OpError, match="2\\^31"):
        spec.check_problem(1 << 20, 1 << 12, "float32")
    with pytest.raises(OpError, match="M and N"):
        spec.check_problem(0, 16, "float32")


@pytest.mark.parametrize("op", sorted(BUILTIN))
def test_inputs_and_references_run_on_cpu(op: str) -> None:
    spec = BUILTIN[op]
    for case in spec.cases:
        ins = spec.make_inputs(5, 300, "bfloat16", torch.Generator().manual_seed(0), case, "cpu")
        assert [tuple(t.shape) for t in ins] == [t.shape(5, 300) for t in spec.inputs]
        refs = spec.run_reference(ins)
        assert [tuple(r.shape) for r in refs] == [t.shape(5, 300) for t in spec.outputs]
        assert all(r.dtype == torch.float64 for r in refs)


def test_special_cases_are_special() -> None:
    g = torch.Generator().manual_seed(0)
    x = get_op("softmax").make_inputs(8, 64, "float32", g, "neg_inf", "cpu")[0]
    assert torch.isinf(x).any() and torch.isinf(x[4]).all()
    t = get_op("cross_entropy").make_inputs(64, 64, "float32", g, "ignore_index", "cpu")[1]
    assert (t == -100).any()


def test_attention_spec_counts_flops_and_is_rated_against_compute() -> None:
    spec, causal = get_op("attention"), get_op("attention_causal")
    assert spec.compute_bound and spec.unit == "TFLOP/s" and get_op("softmax").unit == "TB/s"
    assert spec.work(16, 16384, "bfloat16") == 4 * 16 * 16384**2 * 128  # QK^T and PV, 2*N*N*D each
    assert causal.work(16, 16384, "bfloat16") == spec.work(16, 16384, "bfloat16") / 2
    assert get_op("attention_d64").work(2, 100, "float16") == 4 * 2 * 100**2 * 64
    assert get_op("softmax").work(4, 8, "float32") == get_op("softmax").bytes_moved(4, 8, "float32")
    # its own grid (M * N fixed), verified at every timed shape and at partial tiles
    assert all(m * n == 1 << 18 for m, n in spec.shapes())
    shapes = verify_shapes(spec)
    assert set(spec.shapes()) <= set(shapes) and (2, 5001) in shapes and (5, 129) in shapes
    assert spec.dtypes == ("bfloat16", "float16")


@pytest.mark.parametrize("op", ["attention", "attention_causal"])
def test_attention_reference_is_torch_in_float64(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocked over queries (a few steps here) and equal to torch's attention, with lse."""
    from llmcompile.specs import attention

    monkeypatch.setattr(attention, "ATTN_REF_ELEMS", 3 * 40 * 7)  # 7 queries a step: the blocks' edges
    spec = get_op(op)
    q, k, v = (
        t.double() for t in spec.make_inputs(3, 40, "bfloat16", torch.Generator().manual_seed(1), "large", "cpu")
    )
    o, lse = spec.reference(q, k, v, **spec.scalars)
    causal = op.endswith("causal")
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=spec.scalars["scale"])
    s = (q @ k.transpose(1, 2)) * spec.scalars["scale"]
    if causal:
        s = s.masked_fill(torch.ones(40, 40, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(o, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, torch.logsumexp(s, -1), rtol=1e-12, atol=1e-12)
