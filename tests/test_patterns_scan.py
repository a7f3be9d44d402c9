"""The scan family: one cumsum / cumprod along the last dim, reversed, exclusive or masked
(patterns/scan.py -> prompts/candidates/scan.py.j2 -> reference_kernels/scan.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.level1 import compiles, needs_level1, source


@needs_level1
def test_graph_details_reach_the_kernel() -> None:
    rev = source(91)
    assert "reverse=True" in rev and "exclusive=False" in rev
    assert "exclusive=True" in source(92)
    assert "cutlass.select_(v[1]" in source(93)  # the bool mask
    assert "S.mul" in source(90)


def test_tiling() -> None:
    from reference_kernels import scan as S

    assert S.__doc__
    t = S.resolve_tiling(S.ScanKnobs(), 32, 32768)
    assert (t.vec, t.chunk, t.chunks) == (4, 1024, 32)
    assert S.resolve_tiling(S.ScanKnobs(), 32, 100).num_threads < 256  # a short row uses fewer threads


@needs_level1
@pytest.mark.parametrize("num", [89, 91, 92, 93])
def test_kernels_compile_for_sm90a(num: int, tmp_path: Path) -> None:
    compiles(num, tmp_path, "scan")
