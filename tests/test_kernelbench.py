from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llmcompile.ops import OpError, get_op

PROBLEMS = Path(__file__).resolve().parents[1] / "evals" / "problems"


@pytest.mark.parametrize("name", ["add_rmsnorm", "swiglu", "l2norm_rows", "mean_dim1", "mse_rows"])
def test_problem_loads_with_symbolic_m(name: str) -> None:
    spec = get_op(str(PROBLEMS / f"{name}.py"))
    assert spec.tensors[0].dims[0] == "M" and spec.outputs and spec.fixed_shapes
    m0, n = spec.fixed_shapes[0]
    ins = spec.make_inputs(3, n, spec.dtypes[0], torch.Generator().manual_seed(0), "random", "cpu")
    assert all(t.shape[0] == 3 for t, d in zip(ins, spec.inputs) if d.dims[0] == "M")
    outs = spec.run_reference(ins)
    assert [tuple(o.shape) for o in outs] == [d.shape(3, n) for d in spec.outputs]
    assert spec.bytes_moved(m0, n, spec.dtypes[0]) > 0


def test_non_last_dim_reduction_keeps_fixed_dims() -> None:
    spec = get_op(str(PROBLEMS / "mean_dim1.py"))
    assert spec.tensors[0].dims == ("M", "64", "64", "128") and spec.outputs[0].dims == ("M", "64", "128")


def test_malformed_and_unknown(tmp_path: Path) -> None:
    with pytest.raises(OpError, match="unknown op 'nope'"):
        get_op("nope")
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\n\ndef get_inputs():\n    return []\n")
    with pytest.raises(OpError, match="Model"):
        get_op(str(bad))
    with pytest.raises(OpError, match="no such problem file"):
        get_op(str(tmp_path / "missing.py"))
