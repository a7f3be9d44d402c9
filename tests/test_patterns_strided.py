"""The strided family: one reduction along a middle dim with a prologue, an epilogue and, for a
norm, a rewrite of the input (patterns/strided.py -> prompts/candidates/strided.py.j2 ->
reference_kernels/strided.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmcompile.agent import patterns
from llmcompile.specs import get_op
from tests.level1 import compiles, needs_level1, problem_file, source


@needs_level1
def test_graph_details_reach_the_kernel() -> None:
    rms = source(36)
    assert "def rewrite" in rms and "0.015625" in rms  # mean over 64 channels
    assert "S.argmax" in source(51)
    assert "acc[1]" in source(52)  # the index, not the value


def test_tiling() -> None:
    from reference_kernels import strided as R
    from reference_kernels.tuning import strided as T

    assert R.__doc__
    assert R.resolve_tiling(R.StridedKnobs(), 32, 64, 262144, rewrite=True).vec == 1  # 64 values held
    scalar = R.resolve_tiling(R.StridedKnobs(), 32, 4096, 4095, rewrite=False)  # an odd inner dim
    assert (scalar.vec, scalar.num_threads, scalar.threads_r) == (1, T.SCALAR_THREADS, 8)
    assert R.resolve_tiling(R.StridedKnobs(), 32, 64, 4095, rewrite=True).num_threads == 256
    assert R.resolve_tiling(R.StridedKnobs(), 32, 4096, 4096, rewrite=False).threads_r == 4


def test_an_l1_norm_over_a_middle_dim_is_a_plain_sum(tmp_path: Path) -> None:
    """p=1 sums |x| and takes no root (the strided matcher once took the 2-norm's sqrt for it)."""
    f = problem_file(tmp_path, "l1mid", "torch.norm(x, p=1, dim=1)", "(8, 64, 32)")
    m = patterns.match(get_op(str(f)))
    assert isinstance(m, patterns.Match) and m.pattern == "strided"
    assert "cute.math.abs(x)" in m.source and "sqrt" not in m.source


@needs_level1
@pytest.mark.parametrize("num", [36, 48, 51])
def test_kernels_compile_for_sm90a(num: int, tmp_path: Path) -> None:
    compiles(num, tmp_path, "strided")
