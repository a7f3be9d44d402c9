"""torch's shorthands written out before matching (patterns/decompose.py): each gets the kernel its
written-out form gets, and a call it cannot write out is refused with the reason."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from llmcompile.agent import patterns
from llmcompile.specs import get_op
from tests.level1 import compiled_match, problem_file, right_on_gpu

F = "torch.nn.functional"
AFFINE = "self.weight = nn.Parameter(torch.rand(1024)); self.bias = nn.Parameter(torch.rand(1024))"
# (the shorthand, the same written out, what Model.__init__ holds)
PAIRS = [
    (f"{F}.rms_norm(x, (1024,), self.weight, eps=1e-6)",
     "x * torch.rsqrt(torch.mean(torch.pow(x, 2), dim=-1, keepdim=True) + 1e-6) * self.weight", AFFINE),
    (f"{F}.rms_norm(x, (16, 1024), eps=1e-6)",
     "x * torch.rsqrt(torch.mean(torch.pow(x, 2), dim=(-2, -1), keepdim=True) + 1e-6)", "pass"),
    ("self.norm(x)", "x * torch.rsqrt(torch.mean(torch.pow(x, 2), dim=-1, keepdim=True) + 1e-5) * self.norm.weight",
     "self.norm = nn.RMSNorm(1024, eps=1e-5)"),
    (f"{F}.layer_norm(x, (1024,), self.weight, self.bias)",
     "(x - torch.mean(x, dim=-1, keepdim=True)) * torch.rsqrt(torch.var(x, dim=-1, keepdim=True, correction=0)"
     " + 1e-05) * self.weight + self.bias", AFFINE),
    (f"{F}.rms_norm(x, x.shape[-1:], eps=1e-6)", f"{F}.rms_norm(x, (1024,), eps=1e-6)", "pass"),
    (f"{F}.normalize(x)", "x / torch.clamp_min(torch.norm(x, 2.0, 1, keepdim=True), 1e-12)", "pass"),
    (f"{F}.softmin(x, dim=-1)", "torch.softmax(-x, -1)", "pass"),
    ("self.smin(x)", "torch.softmax(-x, 1)", "self.smin = nn.Softmin(dim=1)"),
    ("torch.special.logsumexp(x, dim=1)", "torch.logsumexp(x, 1, keepdim=False)", "pass"),
    ("torch.linalg.norm(x, dim=(1, 2))", "torch.linalg.vector_norm(x, ord=2, dim=(1, 2), keepdim=False)", "pass"),
    ("x.square().mean(-1)", "torch.pow(x, 2).mean(-1)", "pass"),
    ("x.max(dim=-1).values", "x.max(dim=-1)[0]", "pass"),
    ("x.min(dim=1).indices", "x.min(dim=1)[1]", "pass"),
    ("torch.var_mean(x, dim=-1)", "(torch.var(x, dim=-1), torch.mean(x, dim=-1))", "pass"),
    ("torch.std_mean(x, dim=(1, 2), keepdim=True, correction=0)",
     "(x.std(dim=(1, 2), keepdim=True, correction=0), x.mean(dim=(1, 2), keepdim=True))", "pass"),
    ("torch.nansum(x, dim=-1)", "torch.sum(torch.where(torch.isnan(x), 0.0, x), dim=-1, keepdim=False)", "pass"),
    ("x.nansum(1)", "torch.where(x.isnan(), 0.0, x).sum(dim=1, keepdim=False)", "pass"),
    ("torch.nanmean(x, dim=-1)", "torch.where(torch.isnan(x), 0.0, x).sum(-1) / torch.where(torch.isnan(x), 0.0, 1.0).sum(-1)",
     "pass"),
    ("x.where(x > 0.5, 0.0).sum(-1)", "torch.where(x > 0.5, x, 0.0).sum(-1)", "pass"),  # (the method's order)
    # a sum and a count folded as one tuple: along a middle dim, the first, the whole tensor
    ("torch.nanmean(x, 1)", "torch.where(torch.isnan(x), 0.0, x).sum(1) / torch.where(torch.isnan(x), 0.0, 1.0).sum(1)",
     "pass"),
    ("x.nanmean(0)", "torch.where(torch.isnan(x), 0.0, x).sum(0) / torch.where(torch.isnan(x), 0.0, 1.0).sum(0)",
     "pass"),
    ("torch.nanmean(x)", "torch.where(torch.isnan(x), 0.0, x).sum() / torch.where(torch.isnan(x), 0.0, 1.0).sum()",
     "pass"),
    ("torch.aminmax(x, dim=-1)", "(torch.amin(x, dim=-1, keepdim=False), torch.amax(x, dim=-1, keepdim=False))",
     "pass"),
    ("x.aminmax(dim=1).max - torch.aminmax(x, dim=1).min", "x.amax(1) - x.amin(1)", "pass"),
    ("torch.var_mean(x, dim=0)", "(x.var(0), x.mean(0))", "pass"),  # batch statistics: one Chan merge
    # an index that only inserts dims is the unsqueezes it is
    ("x - x.mean(-1)[..., None]", "x - x.mean(-1).unsqueeze(-1)", "pass"),
    ("x / x.sum(1)[:, None]", "x / x.sum(1).unsqueeze(1)", "pass"),
    ("x - x.mean((0, 2))[None, :, None]", "x - x.mean((0, 2)).unsqueeze(0).unsqueeze(2)", "pass"),
    ("torch.var_mean(x, dim=(0, 2))", "(x.var((0, 2)), x.mean((0, 2)))", "pass"),  # batch statistics
    ("torch.var_mean(x)", "(torch.var(x), torch.mean(x))", "pass"),  # the whole tensor: one Chan fold
    ("torch.std_mean(x, False)", "(x.std(correction=0), x.mean())", "pass"),  # (the bool is `unbiased`)
    ("torch.var_mean(x, None, keepdim=True)", "(x.var(None, keepdim=True), x.mean(None, keepdim=True))", "pass"),
    ("self.ln(x) * 2.0",
     "((x - torch.mean(x, dim=-1, keepdim=True)) * torch.rsqrt(torch.var(x, dim=-1, keepdim=True, correction=0)"
     " + 1e-05) * self.ln.weight + self.ln.bias) * 2.0", "self.ln = nn.LayerNorm(1024)"),
]  # fmt: skip
SHAPE = "(8, 16, 1024)"


@pytest.mark.parametrize("short, written, init", PAIRS)
def test_a_shorthand_gets_the_kernel_of_its_written_out_form(
    short: str, written: str, init: str, tmp_path: Path
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    ms = [
        patterns.match(get_op(str(problem_file(tmp_path / d, "p", f, SHAPE, init))))
        for d, f in (("a", short), ("b", written))
    ]
    assert all(isinstance(m, patterns.Match) for m in ms), ms
    assert ms[0].pattern == ms[1].pattern and ms[0].source == ms[1].source


def test_the_written_out_kernels_compile_for_sm90a(tmp_path: Path) -> None:
    for i, (short, _, init) in enumerate(PAIRS[:4]):
        compiled_match(problem_file(tmp_path, f"p{i}", short, SHAPE, init), "float32", tmp_path)


@pytest.mark.parametrize(
    ("forward", "pattern", "combine"),
    [
        ("torch.logsumexp(x, 1) - x.sum(1)", "strided", "S.joint((S.max_sumexp, (-math.inf, 0.0,)), (S.add, (0.0,)))"),
        ("x.amax(-1) - x.amin(-1)", "norm", "S.joint((S.fmax, (-math.inf,)), (S.fmin, (math.inf,)))"),
        ("torch.aminmax(x, dim=0)", "leading", "S.joint((S.fmin, (math.inf,)), (S.fmax, (-math.inf,)))"),
        ("torch.var_mean(x, dim=1)", "strided", "S.count_mean_m2, (0.0, 0.0, 0.0,)"),
        ("torch.std_mean(x, dim=(0, 1, 2))", "total", "S.count_mean_m2,\n    (0.0, 0.0, 0.0,)"),
        ("torch.var_mean(x)", "total", "S.count_mean_m2,\n    (0.0, 0.0, 0.0,)"),
        ("torch.logsumexp(x, (0, 1, 2)) - x.mean()", "total", "S.joint((S.max_sumexp, (-math.inf, 0.0,)), (S.add"),
    ],
)
def test_reductions_of_different_folds_share_one_trip_for_sm90a(
    forward: str, pattern: str, combine: str, tmp_path: Path
) -> None:
    # each its own combine over its own slots (reference_kernels/reduce.joint); the log-sum-exp's
    # block merge kept beside a plain sum
    m, _ = compiled_match(problem_file(tmp_path, "p", forward, SHAPE), "bfloat16", tmp_path)
    assert m.pattern == pattern and combine in m.source, m.source


@pytest.mark.parametrize("dim", ["1", "0", "None"])
def test_a_nanmean_folds_its_sum_and_count_on_each_template_for_sm90a(dim: str, tmp_path: Path) -> None:
    f = problem_file(tmp_path, "p", f"torch.nanmean(x, dim={dim})", SHAPE)
    m = patterns.match(get_op(str(f)))
    assert isinstance(m, patterns.Match) and m.pattern == {"1": "strided", "0": "leading", "None": "total"}[dim], m
    assert "sum and sum" in m.summary
    compiled_match(f, "bfloat16", tmp_path)


def test_a_layernorm_module_alone_keeps_the_norm_modules_match(tmp_path: Path) -> None:
    m = patterns.match(get_op(str(problem_file(tmp_path, "p", "self.ln(x)", SHAPE, "self.ln = nn.LayerNorm(1024)"))))
    assert isinstance(m, patterns.Match) and "LayerNorm over the last 1 dims" in m.source, m


@pytest.mark.parametrize(
    "forward, reason",
    [
        (f"{F}.rms_norm(x, (1024,))", "`rms_norm` without eps"),
        (f"{F}.softmin(x)", "`softmin` without a dim"),
        (f"{F}.rms_norm(x, x.shape, eps=1e-6)", "a norm over a shape computed in the model"),
        ("torch.linalg.norm(x, ord='nuc', dim=(1, 2))", "(a matrix norm, or none)"),
        ("torch.linalg.norm(x[0], ord=1)", "ord=1 over dim=None"),
        ("torch.stack(torch.var_mean(x, -1))", "`var_mean`'s results used whole"),
        ("torch.nansum(x, -1, dtype=torch.float32)", "`nansum` with a dtype"),
        ("x - torch.nanmean(x)", "x rewritten with 2 reductions of the whole tensor"),
        ("x.std(1) + x.amax(1)", "2 reductions (amax, std) in one fold (up to 3 values, no index)"),
        ("x.argmax(1).float() + x.sum(1)", "in one fold (up to 3 values, no index)"),
    ],
)
def test_what_cannot_be_written_out_is_refused_with_the_reason(forward: str, reason: str, tmp_path: Path) -> None:
    m = patterns.match(get_op(str(problem_file(tmp_path, "p", forward, SHAPE))))
    assert isinstance(m, patterns.NoMatch) and reason in m.reason, m


@pytest.mark.gpu
@pytest.mark.parametrize("i", range(len(PAIRS)))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_shorthands_kernels_are_right_on_the_gpu(i: int, dtype: str, tmp_path: Path) -> None:
    short, _, init = PAIRS[i]
    right_on_gpu(problem_file(tmp_path, "p", short, f"(8, 16, 1024, dtype=torch.{dtype})", init), dtype, tmp_path, 5)


def test_nansums_nan_test_survives_the_compiler(tmp_path: Path) -> None:
    """`x != x` is the NaN test (no fast-math drops it): its kernel's PTX tests for NaN where the
    plain sum's does not."""
    import subprocess
    import sys

    script = (
        "import sys; from pathlib import Path; from tests.level1 import compiled_match, problem_file\n"
        "d = Path(sys.argv[1]); compiled_match(problem_file(d, sys.argv[2], sys.argv[3], '(8, 16, 1024)'), 'float32', d)"
    )
    tests = {}
    for name, forward in (("nan", "torch.nansum(x, dim=-1)"), ("plain", "torch.sum(x, dim=-1)")):
        out = tmp_path / name
        out.mkdir()
        env = {**os.environ, "CUTE_DSL_ARCH": "sm_90a", "CUTE_DSL_KEEP": "ptx", "CUTE_DSL_DUMP_DIR": str(out)}
        subprocess.run([sys.executable, "-c", script, str(out), name, forward], env=env, check=True, timeout=600)
        tests[name] = sum(len(re.findall(r"setp\.(num|nan)\.f32", f.read_text())) for f in out.glob("*.ptx"))
    assert tests["nan"] > 0 == tests["plain"], tests


@pytest.mark.gpu
@pytest.mark.parametrize(
    "forward",
    [
        "torch.logsumexp(x, 1) - x.sum(1)",
        "x.amax(-1) - x.amin(-1)",
        "torch.aminmax(x, dim=0)",
        "torch.aminmax(x)",
        "torch.var_mean(x, dim=0)",
        "x.std(1) / x.mean(1)",
        "torch.std_mean(x, dim=(0, 1, 2))",
        "torch.var_mean(x)",
        "torch.std_mean(x, False)",
    ],
)
def test_reductions_folded_together_are_right_on_the_gpu(forward: str, tmp_path: Path) -> None:
    right_on_gpu(problem_file(tmp_path, "p", forward, SHAPE), "float32", tmp_path, 3)


@pytest.mark.gpu
@pytest.mark.parametrize("dim", ["-1", "1", "0", "None"])
@pytest.mark.parametrize("fn", ["nansum", "nanmean"])
def test_nans_are_left_out_on_the_gpu(fn: str, dim: str, tmp_path: Path) -> None:
    f = problem_file(tmp_path, "p", f"torch.{fn}(torch.where(x > 0.9, float('nan'), x), dim={dim})", SHAPE)
    right_on_gpu(f, "float32", tmp_path, 3)


@pytest.mark.parametrize(
    "index",
    [(slice(None), None), (Ellipsis, None), None, (None, slice(None), None), (Ellipsis, None, slice(None)),
     (None, Ellipsis, None), (slice(None), None, Ellipsis, None, slice(None))],
)  # fmt: skip
def test_an_index_that_inserts_dims_is_its_unsqueezes(index: object) -> None:
    import torch

    from llmcompile.agent.patterns.decompose import _unsqueezes

    t = torch.arange(24.0).reshape(2, 3, 4)
    u = t
    for at in _unsqueezes(index) or []:
        u = u.unsqueeze(at)
    assert u.shape == t[index].shape and torch.equal(u, t[index])


@pytest.mark.parametrize("index", [0, (slice(None), 0), (slice(1, None), None), (Ellipsis, None, Ellipsis), ()])
def test_an_index_that_picks_or_slices_is_not_an_unsqueeze(index: object) -> None:
    from llmcompile.agent.patterns.decompose import _unsqueezes

    assert _unsqueezes(index) is None
