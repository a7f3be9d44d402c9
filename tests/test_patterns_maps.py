"""The map family: every node elementwise (patterns/maps.py -> prompts/candidates/map.py.j2 ->
reference_kernels/map.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmcompile.agent import patterns
from tests.level1 import compiles, needs_level1, problem, source


@needs_level1
def test_graph_details_reach_the_kernel() -> None:
    assert "negative_slope" not in source(20)  # torch's default kept implicit
    assert "alpha=" not in source(31)
    five = source(5)
    assert "arg1: cutlass.Float32" in five and "(in0 * arg1)" in five  # the scalar stays a runtime value
    assert "('row', 'full')" in source(12)


@needs_level1
def test_knob_variants_render() -> None:
    spec = problem(19)
    assert "M.MapKnobs(unroll=8)" in patterns.render(spec, patterns.match(spec), "unroll=8")


def test_tiling() -> None:
    from reference_kernels import map as M

    assert M.__doc__
    assert M.resolve_tiling(M.MapKnobs(), 32, 4095).vec == 1
    assert M.resolve_tiling(M.MapKnobs(), 32, 393216).vec == 4
    with pytest.raises(ValueError):
        M.resolve_tiling(M.MapKnobs(num_threads=100), 32, 4096)


@needs_level1
@pytest.mark.parametrize("num", [5, 12, 19, 88])
def test_kernels_compile_for_sm90a(num: int, tmp_path: Path) -> None:
    compiles(num, tmp_path, "map")
