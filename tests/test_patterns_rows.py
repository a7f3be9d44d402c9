"""The rows family: softmax and log_softmax along the last dim of a 2-D input, whose kernels are
the reference kernels themselves (patterns/rows.py -> reference_kernels/softmax.py,
log_softmax.py, on reference_kernels/reduce.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmcompile.agent import patterns
from llmcompile.specs import get_op
from tests.level1 import compiles, needs_level1, problem_file, source


@needs_level1
def test_the_kernel_is_the_reference_kernel() -> None:
    ref = (Path(__file__).resolve().parents[1] / "reference_kernels" / "softmax.py").read_text()
    assert source(23) == ref
    assert 'OP = "log_softmax"' in source(24)


def test_only_the_last_dim_is_taken(tmp_path: Path) -> None:
    last = problem_file(tmp_path, "last", "torch.log_softmax(x, dim=-1)", "(64, 32)")
    m = patterns.match(get_op(str(last)))
    assert isinstance(m, patterns.Match) and m.pattern == "log_softmax"
    first = problem_file(tmp_path, "first", "torch.softmax(x, dim=0)", "(64, 32)")
    m = patterns.match(get_op(str(first)))
    assert isinstance(m, patterns.NoMatch) and "softmax" in m.reason


@needs_level1
@pytest.mark.parametrize(("num", "pattern"), [(23, "softmax"), (24, "log_softmax")])
def test_kernels_compile_for_sm90a(num: int, pattern: str, tmp_path: Path) -> None:
    compiles(num, tmp_path, pattern)
