"""The rows family: softmax and log_softmax along the last dim, whose kernels are the reference
kernels themselves (patterns/rows.py -> reference_kernels/softmax.py, log_softmax.py, on
reference_kernels/reduce.py; a longer input as rows, prompts/candidates/rows.py.j2); and every
other softmax, on the reduction template of its dim."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.level1 import compiled_match, compiles, needs_level1, problem_file, right_on_gpu, source


@needs_level1
def test_the_kernel_is_the_reference_kernel() -> None:
    ref = (Path(__file__).resolve().parents[1] / "reference_kernels" / "softmax.py").read_text()
    assert source(23) == ref
    assert 'OP = "log_softmax"' in source(24)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_a_2d_last_dim_is_the_reference_kernel(dtype: str, tmp_path: Path) -> None:
    last = problem_file(tmp_path, "last", "torch.log_softmax(x, dim=-1)", f"(64, 32, dtype=torch.{dtype})")
    m, _ = compiled_match(last, dtype, tmp_path, "log_softmax")
    assert m.source == (Path(__file__).resolve().parents[1] / "reference_kernels" / "log_softmax.py").read_text()


# Along the last dim of a longer input, the reference kernel on it as rows (rows.py.j2); every
# other softmax is a log-sum-exp of its dim and x rewritten with it, on the template of that dim:
# the norm template's rows, the strided template's middle dim, the leading template's
NORMALIZED = [
    ("softmax, last dim of 3", "torch.softmax(x, dim=-1)", "(64, 32, 256)", "rows"),
    ("log_softmax, last dim of 4", "torch.log_softmax(x, dim=3)", "(64, 2, 16, 256)", "rows"),
    ("softmax of a scaled input", "torch.softmax(x * 0.5, dim=-1)", "(64, 32, 256)", "norm"),
    ("softmax, middle dim", "torch.softmax(x, dim=1)", "(64, 32, 256)", "strided"),
    ("log_softmax, middle dim", "nn.functional.log_softmax(x, dim=1)", "(64, 32, 256)", "strided"),
    ("softmax, batch dim", "torch.softmax(x, dim=0)", "(64, 32)", "leading"),
    # a flattened view's rows are x's (patterns/lift.py); a result returned in another shape is
    # the same rows in the same memory
    ("softmax of x.view(-1, N)", "x.view(-1, x.size(-1)).softmax(-1)", "(64, 32, 256)", "rows"),
    ("log_softmax returned flat", "torch.log_softmax(x, dim=-1).view(-1)", "(64, 256)", "rows"),
]


@pytest.mark.parametrize(("what", "forward", "shape", "pattern"), NORMALIZED)
def test_a_softmax_along_any_dim_compiles_for_sm90a(
    what: str, forward: str, shape: str, pattern: str, tmp_path: Path
) -> None:
    m, _ = compiled_match(problem_file(tmp_path, "sm", forward, shape), "bfloat16", tmp_path, pattern)
    if pattern == "rows":
        # (the output's rows are x's, whatever shape the output is returned in)
        assert "K.launch(_rows(in0, rows), _rows(out, rows), stream)" in m.source
        assert f"rows = in0.shape[0] * {math.prod(eval(shape)[1:-1])}" in m.source
    else:
        assert ("cute.math.exp(" in m.source) == what.startswith("softmax")


@pytest.mark.gpu
@pytest.mark.parametrize(("what", "forward", "shape", "pattern"), NORMALIZED)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_softmax_along_any_dim_is_right(
    what: str, forward: str, shape: str, pattern: str, dtype: str, tmp_path: Path
) -> None:
    big = shape.replace("(64, ", "(1024, ").replace(")", f", dtype=torch.{dtype})")
    right_on_gpu(problem_file(tmp_path, "sm", forward, big), dtype, tmp_path, 3)


@needs_level1
@pytest.mark.parametrize(("num", "pattern"), [(23, "softmax"), (24, "log_softmax")])
def test_kernels_compile_for_sm90a(num: int, pattern: str, tmp_path: Path) -> None:
    compiles(num, tmp_path, pattern)
