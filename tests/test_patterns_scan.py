"""The scan family: one cumsum, cumprod, logcumsumexp, cummax or cummin along the last dim,
reversed, exclusive or masked (patterns/scan.py -> prompts/candidates/scan.py.j2 ->
reference_kernels/scan.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmcompile.agent import patterns
from llmcompile.specs import get_op
from tests.level1 import compiled_match, compiles, needs_level1, problem_file, right_on_gpu, source


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


# scans beyond the sum and the product: (what, forward, the combine its kernel folds with)
SCANS = [
    ("logcumsumexp", "torch.logcumsumexp(x, -1)", "S.log_add_exp, -math.inf"),
    ("logcumsumexp reversed", "torch.logcumsumexp(x.flip(-1), dim=-1).flip(-1)", "S.log_add_exp, -math.inf"),
    ("cummax's values", "torch.cummax(x, -1).values", "S.fmax, -math.inf"),
    ("cummin's values, of a prologue", "torch.cummin(x * 2.0, dim=-1)[0]", "S.fmin, math.inf"),
    ("cummax's values, reversed", "x.flip(-1).cummax(-1)[0].flip(-1)", "S.fmax, -math.inf"),
]


@pytest.mark.parametrize(("what", "forward", "combine"), SCANS)
def test_other_scans_compile_for_sm90a(what: str, forward: str, combine: str, tmp_path: Path) -> None:
    m, _ = compiled_match(problem_file(tmp_path, "s", forward, "(64, 4096)"), "float32", tmp_path, "scan")
    assert f"S.RowScan(prologue, {combine}, reverse={'reversed' in what}" in m.source, m.source


@pytest.mark.parametrize(
    ("forward", "reason"),
    [
        ("torch.cummax(x, -1)", "whose indices are read"),
        ("torch.cummin(x, -1).indices", "whose indices are read"),
        # (torch's exclusive form leads with the cat's zeros, the kernel with the scan's identity)
        (
            "torch.cat((torch.zeros_like(x[:, :1]), torch.cumprod(x.narrow(1, 0, x.size(1) - 1), 1)), 1)",
            "an exclusive `cumprod` led by zeros",
        ),
    ],
)
def test_a_scan_the_template_does_not_write_is_refused(forward: str, reason: str, tmp_path: Path) -> None:
    m = patterns.match(get_op(str(problem_file(tmp_path, "s", forward, "(64, 4096)"))))
    assert isinstance(m, patterns.NoMatch) and reason in m.reason, m


@pytest.mark.gpu
@pytest.mark.parametrize(("what", "forward", "combine"), SCANS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_other_scans_are_right(what: str, forward: str, combine: str, dtype: str, tmp_path: Path) -> None:
    right_on_gpu(problem_file(tmp_path, "s", forward, f"(4096, 4000, dtype=torch.{dtype})"), dtype, tmp_path, 29)
