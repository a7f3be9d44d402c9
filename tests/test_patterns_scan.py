"""The scan family: one cumsum, cumprod, logcumsumexp, cummax or cummin along a dim, reversed,
exclusive or masked (patterns/scan.py -> prompts/candidates/scan.py.j2 -> reference_kernels/scan.py
for the last dim, reference_kernels/scan_columns.py for another)."""

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


# scans along another dim: (forward, the input's shape, how the kernel is made)
COLUMNS = [
    (
        "torch.cumsum(x, 1)",
        "(64, 32, 256)",
        "C.ColumnScan(\n    1, prologue, S.add, 0.0, reverse=False, exclusive=False",
    ),
    ("torch.cumsum(x, dim=0)", "(4096, 1024)", "C.ColumnScan(\n    0, prologue, S.add, 0.0, reverse=False"),
    ("torch.cumsum(x.flip(1), 1).flip(1)", "(16, 300, 64)", "reverse=True, exclusive=False"),
    ("torch.logcumsumexp(x, -2)", "(8, 1000, 36)", "C.ColumnScan(\n    1, prologue, S.log_add_exp, -math.inf"),
    ("torch.cummax(x, 0).values", "(64, 32, 256)", "C.ColumnScan(\n    0, prologue, S.fmax, -math.inf"),
    ("torch.cumprod(x * 0.5, 1)", "(8, 100, 7)", "S.mul, 1.0"),
    ("torch.cumsum(x.view(x.size(0), 16, -1), 1)", "(64, 32, 256)", "C.ColumnScan(\n    1, prologue, S.add"),
    # (few columns: the batch dim in segments, their totals through the workspace)
    ("torch.cumsum(x.flip(0), 0).flip(0)", "(3000, 40)", "reverse=True, exclusive=False"),
    ("torch.cummin(x * 2.0, 0).values", "(3000, 40)", "WORKSPACE = C.workspace_elems(40)"),
    # (down all of the view's rows, M * 32 of them: the kernel reads L from the output's dim 0)
    ("x.view(-1, 256).cumsum(0)", "(64, 32, 256)", "C.ColumnScan(\n    0, prologue, S.add"),
    (
        "torch.cat((torch.zeros_like(x.select(1, 0).unsqueeze(1)), torch.cumsum(x.narrow(1, 0, x.size(1) - 1), 1)), 1)",
        "(64, 32, 256)",
        "reverse=False, exclusive=True",
    ),
]


def test_a_scan_of_a_view_that_keeps_the_memory_is_taken(tmp_path: Path) -> None:
    # (the kernels read every input at the output's flat offsets: a view of the same elements
    # in the same order is the same memory)
    for forward in ("torch.cumsum(x.view(x.size(0), -1), -1)", "torch.cumsum(x.view(x.size(0), 16, -1), 1)"):
        m = patterns.match(get_op(str(problem_file(tmp_path, "s", forward, "(64, 32, 256)"))))
        assert isinstance(m, patterns.Match) and m.pattern == "scan", (forward, m)


@pytest.mark.parametrize(("forward", "shape", "made"), COLUMNS)
def test_column_scans_compile_for_sm90a(forward: str, shape: str, made: str, tmp_path: Path) -> None:
    m, _ = compiled_match(problem_file(tmp_path, "s", forward, shape), "float32", tmp_path, "scan")
    assert made in m.source, m.source


def test_column_tiling() -> None:
    from reference_kernels import scan_columns as C

    assert C.__doc__
    k = C.ColumnScanKnobs()
    # the batch dim of few columns: L over 8 threads (tuning.scan), a warp's row 32 vectors
    t = C.resolve_tiling(k, 32, 16384, None)
    assert (t.vec, t.threads_inner, t.threads_r, t.col_tiles) == (4, 32, 8, 128)
    # many columns: one thread a column's L
    assert C.resolve_tiling(k, 32, 1 << 22, None).threads_r == 1
    # a long middle dim: L over threads (fewer for logcumsumexp, whose steps are exp2 and log2);
    # a short one of a large batch: one thread walks it
    assert C.resolve_tiling(k, 32, 4096, 4096).threads_r == 8
    assert C.resolve_tiling(k, 32, 4096, 4096, 1, "log_add_exp").threads_r == 4
    assert C.resolve_tiling(k, 32, 2048, 32).threads_r == 1
    # columns fewer than a warp's lanes: the rest of the warp along L
    t = C.resolve_tiling(k, 16, 8, 20)
    assert (t.threads_inner, t.num_threads) == (1, 32)
    with pytest.raises(ValueError):
        C.resolve_tiling(C.ColumnScanKnobs(threads_r=3), 32, 4096, 100)
    # few columns along the batch dim: segments of it, as many as the workspace holds totals of;
    # a middle dim's batch makes its CTAs
    assert C.resolve_tiling(k, 32, 256, None, 1, "add", C.workspace_elems(256)).splits == 64
    assert C.resolve_tiling(k, 32, 16384, None, 1, "add", C.workspace_elems(16384)).splits == 1
    assert C.resolve_tiling(k, 32, 256, 4096, 1, "add", C.workspace_elems(256)).splits == 1
    assert C.workspace_elems(256) == 64 * 256 and C.workspace_elems(1 << 23) == 0
    with pytest.raises(ValueError):
        C.resolve_tiling(C.ColumnScanKnobs(splits=65), 32, 256, None, 1, "add", C.workspace_elems(256))
    from llmcompile.specs.contract import MAX_WORKSPACE
    from reference_kernels.tuning import scan as T

    assert T.COLUMN_MAX_WORKSPACE == MAX_WORKSPACE


@pytest.mark.parametrize(
    ("forward", "reason"),
    [
        # (a weight of the last dim's length, read where the output is written: past its end)
        ("torch.cumsum(x * w, -1)", "broadcast or reduced"),
        ("torch.cumsum(x * w, 0)", "broadcast or reduced"),
        ("torch.cumsum(x.sum(0) * w, -1)", "broadcast or reduced"),
    ],
)
def test_a_scan_of_a_broadcast_input_is_refused(forward: str, reason: str, tmp_path: Path) -> None:
    f = problem_file(tmp_path, "s", forward, "(64, 4096)", init="pass")
    f.write_text(
        f.read_text()
        .replace("def forward(self, x):", "def forward(self, x, w):")
        .replace("return [torch.rand(64, 4096)]", "return [torch.rand(64, 4096), torch.rand(4096)]")
    )
    m = patterns.match(get_op(str(f)))
    assert isinstance(m, patterns.NoMatch) and reason in m.reason, m


@pytest.mark.gpu
@pytest.mark.parametrize(("forward", "shape", "made"), COLUMNS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_column_scans_are_right(forward: str, shape: str, made: str, dtype: str, tmp_path: Path) -> None:
    shape = shape[:-1] + f", dtype=torch.{dtype})"
    right_on_gpu(problem_file(tmp_path, "s", forward, shape), dtype, tmp_path, 31)


@pytest.mark.gpu
@pytest.mark.parametrize(("what", "forward", "combine"), SCANS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_other_scans_are_right(what: str, forward: str, combine: str, dtype: str, tmp_path: Path) -> None:
    right_on_gpu(problem_file(tmp_path, "s", forward, f"(4096, 4000, dtype=torch.{dtype})"), dtype, tmp_path, 29)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "forward",
    [
        "torch.logcumsumexp(x, -1)",
        "torch.logcumsumexp(x.flip(-1), dim=-1).flip(-1)",
        "torch.logcumsumexp(x, 0)",  # (the rows below as columns: the column scan)
        "torch.logcumsumexp(x.flip(0), 0).flip(0)",
    ],
)
def test_logcumsumexp_of_infinities_is_torchs(forward: str, tmp_path: Path) -> None:
    """+inf from the first +inf on and -inf before the first finite element: within a thread's
    run, across warps and chunks, and where a run or a whole row is infinite."""
    import torch

    from llmcompile.specs import contract

    cols = ", 0)" in forward
    spec = get_op(str(problem_file(tmp_path, "s", forward, "(5000, 9)" if cols else "(9, 5000)")))
    m = patterns.match(spec)
    (tmp_path / "k.py").write_text(m.source)
    mod = contract.load_module(tmp_path / "k.py")
    ws = contract.workspace_of(mod)  # (the batch dim's 9 columns: in segments)
    fn = contract.compile_entry(contract.entry_of(mod), spec, "float32", 9 if cols else 5000, workspace=ws)
    fn = contract.with_workspace(fn, len(spec.tensors), ws)
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
    if cols:
        x = x.T.contiguous()
    out = torch.full_like(x, float("nan"))
    fn(x, out)
    torch.cuda.synchronize()
    d = 0 if cols else -1
    flip = "flip" in forward
    ref = torch.logcumsumexp(x.double().flip(d) if flip else x.double(), d)
    torch.testing.assert_close(out.double(), ref.flip(d) if flip else ref, rtol=1e-5, atol=1e-4)
