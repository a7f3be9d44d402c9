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
    # (a bf16 logcumsumexp's run is longer: its combine's exp2 and log2 bound it, tuning.scan)
    assert S.resolve_tiling(S.ScanKnobs(), 16, 16384, "log_add_exp").per_thread == 16
    assert S.resolve_tiling(S.ScanKnobs(), 32, 16384, "log_add_exp").per_thread == 4
    assert S.resolve_tiling(S.ScanKnobs(per_thread=8), 16, 16384, "log_add_exp").per_thread == 8


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


@pytest.mark.gpu
@pytest.mark.parametrize("forward", ["torch.logcumsumexp(x, -1)", "torch.logcumsumexp(x.flip(-1), dim=-1).flip(-1)"])
def test_logcumsumexp_of_infinities_is_torchs(forward: str, tmp_path: Path) -> None:
    """+inf from the first +inf on and -inf before the first finite element: within a thread's
    run, across warps and chunks, and where a run or a whole row is infinite."""
    import torch

    from llmcompile.specs import contract

    spec = get_op(str(problem_file(tmp_path, "s", forward, "(9, 5000)")))
    m = patterns.match(spec)
    (tmp_path / "k.py").write_text(m.source)
    fn = contract.compile_entry(contract.entry_of(contract.load_module(tmp_path / "k.py")), spec, "float32", 5000)
    x = torch.randn(9, 5000, generator=torch.Generator().manual_seed(3)).mul(30).cuda()
    inf = float("inf")
    x[0] = -inf
    x[1, :2500] = -inf
    x[2, 1] = inf
    x[3, [17, 3000]] = inf
    x[4, 4999] = inf
    x[5, ::7] = -inf
    x[6] = inf
    x[7, :1000] = -inf
    x[7, 1000] = inf
    x[8, 2048:4096] = -inf  # (whole chunks of a row)
    out = torch.full_like(x, float("nan"))
    fn(x, out)
    torch.cuda.synchronize()
    flip = "flip" in forward
    ref = torch.logcumsumexp(x.double().flip(-1) if flip else x.double(), -1)
    torch.testing.assert_close(out.double(), ref.flip(-1) if flip else ref, rtol=1e-5, atol=1e-4)
