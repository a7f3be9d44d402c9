from __future__ import annotations

import pytest
import torch

from llmcompile.ops import BUILTIN, OpError, bench_shapes, dtype_name, get_op


def test_unknown_op_names_the_known_ones() -> None:
    with pytest.raises(
        OpError,
        match="unknown op .sofmax.; known ops: copy, cross_entropy, cross_entropy_bwd, cross_entropy_fused, cross_entropy_fwd, layernorm",
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
