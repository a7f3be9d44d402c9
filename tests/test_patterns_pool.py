"""The pool family: max and average pooling over 1-3 spatial dims (patterns/pool.py ->
prompts/candidates/pool.py.j2 -> reference_kernels/pool.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmcompile.agent import patterns
from llmcompile.specs import get_op
from tests.level1 import compiles, needs_level1, problem_file, source


@needs_level1
def test_graph_details_reach_the_kernel() -> None:
    mp1 = source(41)
    assert '"max"' in mp1 and "padding=4" in mp1 and "dilation=3" in mp1
    ap2 = source(45)  # stride defaults to the kernel
    assert '"avg"' in ap2 and "kernel=11" in ap2 and "stride=11" in ap2 and "count_include_pad=True" in ap2


def test_output_shapes_follow_torch() -> None:
    import torch

    from reference_kernels import pool as P

    # the output sizes torch gives, dilation and padding included
    for size, k, s, p, d in [
        ((37,), 8, 1, 4, 3),
        ((33, 40), 4, 1, 1, 1),
        ((9, 17, 20), 3, 2, 1, 3),
        ((64, 64), 11, 11, 0, 1),
    ]:
        x = torch.zeros(1, 1, *size)
        pool = {1: torch.nn.MaxPool1d, 2: torch.nn.MaxPool2d, 3: torch.nn.MaxPool3d}[len(size)]
        want = pool(k, s, p, d)(x).shape[2:]
        got = P.resolve_shape(P.PoolKnobs(), size, k, s, p, d).out
        assert got[3 - len(size) :] == tuple(want)
    sh = P.resolve_shape(P.PoolKnobs(), (64, 64), 4, 1, 1, 1)
    assert sh.rows == 4 and sh.row_offsets() == list(range(7))  # 7 input rows serve 4 output rows
    assert P.resolve_shape(P.PoolKnobs(), (64, 64), 11, 11, 0, 1).rows == 1  # no overlap: nothing to share
    assert P.resolve_shape(P.PoolKnobs(), (8, 8, 62), 3, 2, 1, 3).num_threads == 32  # a narrow row, a narrow CTA
    with pytest.raises(ValueError):
        P.resolve_shape(P.PoolKnobs(), (8,), 3, 1, 2, 1)  # padding over half the window


def test_pooling_the_template_does_not_take_says_why(tmp_path: Path) -> None:
    ceil = problem_file(tmp_path, "ceil", "self.p(x)", "(4, 3, 16, 16)", "self.p = nn.MaxPool2d(3, 2, ceil_mode=True)")
    assert "ceil_mode" in patterns.match(get_op(str(ceil))).reason


@needs_level1
@pytest.mark.parametrize("num", [41, 43, 45])
def test_kernels_compile_for_sm90a(num: int, tmp_path: Path) -> None:
    compiles(num, tmp_path, "pool")
