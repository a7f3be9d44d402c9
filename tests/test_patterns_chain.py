"""The chain: a statistic of each row, then a whole-tensor fold of those values
(patterns/chain.py -> prompts/candidates/rows_total.py.j2 -> reference_kernels/norm.py, total.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.level1 import compiled_match, problem_file, right_on_gpu

# (name, forward, the row statistic's fold and the whole fold as the kernel writes them)
CHAINS = [
    ("zloss", "torch.logsumexp(x, -1).pow(2).mean()", "S.max_sumexp", "S.add"),
    ("norms", "x.norm(dim=-1).mean()", "S.add", "S.add"),
    ("peak", "x.amax(-1).amin() * 2.0 + 1.0", "S.fmax", "S.fmin"),
    ("spread", "(x.amax(-1) - x.amin(-1)).mean()", "S.joint((S.fmax, (-math.inf,)), (S.fmin, (math.inf,)))", "S.add"),
    ("var_sum", "x.var(-1).sum()", "S.count_mean_m2", "S.add"),
    ("trailing", "x.norm(dim=(1, 2)).amax()", "S.add", "S.fmax"),
]


def _pair_file(tmp_path: Path, forward: str, shape: str) -> Path:
    """forward(x, y) of two inputs of torch.rand`shape`."""
    f = tmp_path / "pair.py"
    f.write_text(
        "import torch\nfrom torch import nn\n\nclass Model(nn.Module):\n    def forward(self, x, y):\n"
        f"        return {forward}\n\ndef get_inputs():\n    return [torch.rand{shape}, torch.rand{shape}]\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    return f


@pytest.mark.parametrize(("name", "forward", "rows", "whole"), CHAINS)
def test_rows_then_their_fold_compile_for_sm90a(name: str, forward: str, rows: str, whole: str, tmp_path: Path) -> None:
    m, ws = compiled_match(problem_file(tmp_path, name, forward, "(64, 32, 256)"), "bfloat16", tmp_path, "total")
    src = m.source
    assert f"_rows = N.GroupedNorm(\n    row_prologue,\n    {rows}," in src
    assert f"_total = T.TotalReduce(prologue, {whole}," in src
    assert "T.fold_row_chunks(stage, _total, (out,), rows, workspace, stream)" in src
    lead = 1 if name == "trailing" else 2
    assert f"rows = Int64({' * '.join(f'in0.shape[{d}]' for d in range(lead))})" in src
    assert ws > 0


def test_two_inputs_reach_the_rows(tmp_path: Path) -> None:
    """A mean distance: both inputs sliced to the same rows, the second the norm's "full" parameter."""
    src = _pair_file(tmp_path, "(x - y).pow(2).sum(-1).sqrt().mean()", "(64, 512)")
    m, _ = compiled_match(src, "float32", tmp_path, "total")
    assert "others = (T.pass_rows(in1, start, n, ROW),)" in m.source and "param_kinds=('full',)" in m.source
    assert "(x - p[0])" in m.source


@pytest.mark.parametrize(
    "forward",
    [
        "x - x.sum(-1, keepdim=True).mean()",  # the fold's value read beside x
        "x.sum(-1).mean() + x.amax()",  # two whole folds
        "x.sum(-1).amax(-1)",  # the second fold along a dim, not whole
        "x.sum(-1) / x.sum(-1).mean()",  # the rows' values read again after the fold
    ],
)
def test_other_chains_are_not_taken_as_one(forward: str, tmp_path: Path) -> None:
    from llmcompile.agent import patterns
    from llmcompile.specs import get_op

    m = patterns.match(get_op(str(problem_file(tmp_path, "other", forward, "(64, 32, 256)"))))
    assert not (isinstance(m, patterns.Match) and m.jinja == "candidates/rows_total.py.j2"), m


def test_a_model_parameter_is_refused(tmp_path: Path) -> None:
    from llmcompile.agent import patterns
    from llmcompile.specs import get_op

    init = "self.w = nn.Parameter(torch.rand(256))"
    f = problem_file(tmp_path, "weighted", "(x * self.w).sum(-1).mean()", "(64, 256)", init)
    m = patterns.match(get_op(str(f)))
    assert isinstance(m, patterns.NoMatch) and "a model's parameters" in m.reason, m


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "forward", "rows", "whole"), CHAINS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rows_then_their_fold_are_right(name: str, forward: str, rows: str, whole: str, dtype: str, tmp_path: Path):
    shape = f"(256, 32, 256, dtype=torch.{dtype})"
    right_on_gpu(problem_file(tmp_path, name, forward, shape), dtype, tmp_path, 31)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("forward", "shape"),
    [
        ("x.norm(dim=-1).mean()", "(64, 65536)"),  # rows past a CTA's: the norm's partials in the workspace
        ("torch.logsumexp(x, -1).mean()", "(1 << 22, 4)"),  # past one pass of the rows' values
    ],
)
def test_long_and_many_rows_are_right(forward: str, shape: str, tmp_path: Path) -> None:
    right_on_gpu(problem_file(tmp_path, "edge", forward, shape), "float32", tmp_path, 37)


@pytest.mark.gpu
def test_a_mean_distance_is_right(tmp_path: Path) -> None:
    src = _pair_file(tmp_path, "(x - y).pow(2).sum(-1).sqrt().mean()", "(4096, 512, dtype=torch.bfloat16)")
    right_on_gpu(src, "bfloat16", tmp_path, 41)
