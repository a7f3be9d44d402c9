"""patterns/idioms.py: a softmax written out by hand is torch's, and a sum of exp(x - max) one fold,
on every template."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmcompile.agent import patterns
from llmcompile.specs import get_op
from tests.level1 import compiled_match, problem_file, right_on_gpu

E = "torch.exp(x - x.amax({d}, keepdim=True))"
# (what, forward with {d}, d, template, torch's op it is)
WHOLE = [
    ("softmax, last dim", f"{E} / {E}.sum({{d}}, keepdim=True)", "-1", "rows", "softmax"),
    (
        "softmax through max(...)[0], middle dim",
        "(lambda e: e / e.sum(1, keepdim=True))(torch.exp(x - x.max(1, keepdim=True)[0]))",
        "1",
        "strided",
        "softmax",
    ),
    (
        "log_softmax, first dim",
        f"x - x.amax({{d}}, keepdim=True) - torch.log({E}.sum({{d}}, keepdim=True))",
        "0",
        "leading",
        "log_softmax",
    ),
    ("x - logsumexp, last dim", "x - torch.logsumexp(x, {d}, keepdim=True)", "-1", "rows", "log_softmax"),
    (
        "exp(x - logsumexp), middle dim",
        "torch.exp(x - torch.logsumexp(x, dim={d}, keepdim=True))",
        "1",
        "strided",
        "softmax",
    ),
]
PART = [("logsumexp, last dims", f"{E}.sum({{d}}).log() + x.amax({{d}})", "(1, 2)", "norm", "")]
WRITTEN = WHOLE + PART  # fmt: skip


def _body(forward: str, d: str) -> str:
    return forward.format(d=d).replace("{d}", d)


@pytest.mark.parametrize(("what", "forward", "d", "pattern", "op"), WHOLE)
def test_a_whole_softmax_written_out_is_torchs(what: str, forward: str, d: str, pattern: str, op: str, tmp_path: Path):
    """(Written out, it had run at 84% of copy on the norm template, H200.)"""
    m, _ = compiled_match(problem_file(tmp_path, "w", _body(forward, d), "(16, 32, 256)"), "float32", tmp_path, pattern)
    assert m.summary.startswith(f"{op} "), m.summary


@pytest.mark.parametrize(("what", "forward", "d", "pattern", "op"), PART)
def test_a_sum_of_exp_written_out_is_one_fold(what: str, forward: str, d: str, pattern: str, op: str, tmp_path: Path):
    m, _ = compiled_match(problem_file(tmp_path, "w", _body(forward, d), "(16, 32, 256)"), "float32", tmp_path, pattern)
    assert m.source.count("S.max_sumexp") == 1 and "logsumexp" in m.summary, m.source


@pytest.mark.parametrize(
    "forward",
    [
        f"{E.format(d=1)} / {E.format(d=1)}.sum(2, keepdim=True)",  # (another dim's sum)
        f"{E.format(d=-1)} / ({E.format(d=-1)}.sum(-1, keepdim=True) + 1.0)",  # (not the sum alone)
        "x - x.amax(-1, keepdim=True) - torch.log(torch.exp(x - x.amin(-1, keepdim=True)).sum(-1, keepdim=True))",
        "x - torch.logsumexp(x, (1, 2), keepdim=True)",  # (two dims: no torch op is that)
    ],
)
def test_a_normalizer_that_only_looks_like_one_is_left_as_written(forward: str, tmp_path: Path) -> None:
    m = patterns.match(get_op(str(problem_file(tmp_path, "w", forward, "(16, 32, 256)"))))
    assert not getattr(m, "summary", "").startswith(("softmax ", "log_softmax ")), m


@pytest.mark.parametrize(
    "forward",
    [
        "torch.exp(x - x.amax(1, keepdim=True)).sum(2)",  # (another dim's sum)
        "torch.exp(x - x.amax(1)).sum(1)",  # (the max not kept: (256, 256) broadcast over the first dim)
        "torch.exp(x - x.mean(1, keepdim=True)).sum(1)",  # (not a max)
        "torch.exp(x - x.amax(1, keepdim=True)).sum(1, dtype=torch.float64).float()",  # (another dtype)
    ],
)
def test_a_sum_that_only_looks_like_it_is_left_as_written(forward: str, tmp_path: Path) -> None:
    m = patterns.match(get_op(str(problem_file(tmp_path, "w", forward, "(256, 256, 256)"))))
    assert "logsumexp" not in getattr(m, "summary", ""), m


@pytest.mark.gpu
@pytest.mark.parametrize(("what", "forward", "d", "pattern", "op"), WRITTEN)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_softmax_written_out_is_right(what: str, forward: str, d: str, pattern: str, op: str, dtype: str, tmp_path):
    src = problem_file(tmp_path, "w", _body(forward, d), f"(64, 32, 256, dtype=torch.{dtype})")
    right_on_gpu(src, dtype, tmp_path, 41)


@pytest.mark.parametrize(("what", "forward", "d", "pattern", "op"), WRITTEN)
def test_the_folded_graph_computes_what_the_written_one_does(what: str, forward: str, d: str, pattern: str, op: str):
    """The folded graph, in float64 on the CPU, gives the model's values (spikes included)."""
    import torch
    from torch import fx, nn
    from torch.fx.passes.shape_prop import ShapeProp

    from llmcompile.agent.patterns.idioms import fold_idioms

    body = _body(forward, d)

    class Model(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return eval(body, {"torch": torch}, {"x": x})

    x = torch.randn(4, 8, 64, dtype=torch.float64) * 30.0
    gm = fx.symbolic_trace(Model())
    ShapeProp(gm).propagate(x)
    assert fold_idioms(gm)
    assert torch.allclose(gm(x), Model()(x), rtol=1e-12, atol=1e-12)


# (a reduction of a reduction of the same kind, or of a view that merges or splits only the dims it
# reduces, the one reduction of x it is)
CHAINS = [
    ("x.view(x.size(0), -1).sum(-1)", "x.sum((1, 2))"),
    ("x.flatten(1).amax(1)", "x.amax((1, 2))"),
    ("torch.flatten(x, 1).mean(-1)", "x.mean((1, 2))"),
    ("x.reshape(x.shape[0], 4, 8, 256).var((1, 2), unbiased=False)", "x.var(1, unbiased=False)"),
    ("torch.std(x.view(x.size(0), -1), 1)", "x.std((1, 2))"),
    ("torch.reshape(x, (x.shape[0], 8, 4, 256)).amin((1, 2))", "x.amin(1)"),
    ("x.mean(-1).mean(-1)", "x.mean((1, 2))"),
    ("torch.mean(torch.mean(x, dim=2), dim=1)", "x.mean((1, 2))"),
    ("x.amax(2, keepdim=True).amax(1, keepdim=True)", "x.amax((1, 2), keepdim=True)"),
    ("x.sum(0).sum(0)", "x.sum((0, 1))"),
    ("x.amax((0, 2)) + x.sum(-1).sum(0)", "x.amax((0, 2)) + x.sum((0, 2))"),  # (batch statistics)
    ("x.sum(-1).sum(-1).sum(-1)", "x.sum((0, 1, 2))"),
    ("x.amin(1).amin()", "x.amin()"),
]


# (a norm of a flattened view: its kernel is the norm's over x's dims, whose GPU tests are coverage's)
NORM_VIEWS = [
    ("x.view(x.size(0), -1).norm(dim=1)", "x.norm(dim=(1, 2))"),
    ("torch.norm(x.flatten(1), 2, 1)", "torch.norm(x, 2, (1, 2))"),
    ("torch.linalg.vector_norm(x.flatten(1), ord=1, dim=-1)", "torch.linalg.vector_norm(x, ord=1, dim=(1, 2))"),
]


@pytest.mark.parametrize(("chain", "one"), CHAINS + NORM_VIEWS)
def test_a_chain_of_reductions_is_the_one_reduction_it_is(chain: str, one: str, tmp_path: Path) -> None:
    ms = []
    for d, forward in (("a", chain), ("b", one)):
        (tmp_path / d).mkdir()
        ms.append(patterns.match(get_op(str(problem_file(tmp_path / d, "p", forward, "(16, 32, 256)")))))
    assert all(isinstance(m, patterns.Match) for m in ms) and ms[0].source == ms[1].source, ms


@pytest.mark.parametrize(
    "forward",
    [
        "x.mean(-1).sum(-1)",
        "x.mean(-1, keepdim=True).mean(-1)",
        "x.mean(-1) + x.mean(-1).mean(-1, keepdim=True)",
        "x.reshape(-1, 256).sum(-1)",  # (the kept dims regrouped too: the output is not x.sum(-1)'s shape)
        "x.flatten(1).sum(-1, keepdim=True)",
    ],
)
def test_a_chain_of_other_kinds_or_keepdims_is_left_as_written(forward: str) -> None:
    import torch
    from torch import fx, nn
    from torch.fx.passes.shape_prop import ShapeProp

    from llmcompile.agent.patterns.idioms import fold_idioms

    class Model(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return eval(forward, {"torch": torch}, {"x": x})

    gm = fx.symbolic_trace(Model())
    ShapeProp(gm).propagate(torch.randn(4, 8, 64))
    assert not fold_idioms(gm)


@pytest.mark.parametrize(("chain", "one"), CHAINS + NORM_VIEWS)
def test_a_folded_chain_computes_what_the_written_one_does(chain: str, one: str) -> None:
    """Folded, the graph has the calls of the one reduction, and its values (float64, CPU)."""
    import torch
    from torch import fx, nn
    from torch.fx.passes.shape_prop import ShapeProp

    from llmcompile.agent.patterns.idioms import fold_idioms

    def traced(forward: str) -> fx.GraphModule:
        class Model(nn.Module):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return eval(forward, {"torch": torch}, {"x": x})

        return fx.symbolic_trace(Model())

    def calls(gm: fx.GraphModule) -> int:
        return sum(n.op in ("call_function", "call_method") for n in gm.graph.nodes)

    x = torch.randn(4, 32, 256, dtype=torch.float64)
    gm, want = traced(chain), traced(one)
    ShapeProp(gm).propagate(x)
    assert fold_idioms(gm) and calls(gm) == calls(want)
    assert torch.allclose(gm(x), want(x), rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize(("chain", "one"), CHAINS)
def test_a_chain_of_reductions_is_right(chain: str, one: str, tmp_path: Path) -> None:
    right_on_gpu(problem_file(tmp_path, "w", chain, "(64, 32, 256, dtype=torch.bfloat16)"), "bfloat16", tmp_path, 7)


# (a mean of squared deviations from the mean, written out, and the biased var it is: the kernels
# of the var forms alone are coverage's, GPU-run there)
V = "torch.var(x, dim={d}, unbiased=False, keepdim={k})"
CENTERED = [
    ("((x - x.mean(-1, keepdim=True)) ** 2).mean(-1)", V.format(d="-1", k=False)),
    ("torch.mean((x - x.mean(dim=1, keepdim=True)).pow(2), dim=1)", V.format(d="1", k=False)),
    ("(lambda d: (d * d).mean(0))(x - x.mean(0, keepdim=True))", V.format(d="0", k=False)),
    ("torch.square(x - x.mean((0, 2), keepdim=True)).mean((0, 2))", V.format(d="(0, 2)", k=False)),
    # (a sum of squared deviations: the var times the count, where the batch dim is not summed)
    ("((x - x.mean(-1, keepdim=True)) ** 2).sum(-1)", "torch.var(x, dim=-1, unbiased=False) * 256.0"),
    ("(x - x.mean((1, 2), keepdim=True)).pow(2).sum((1, 2), keepdim=True)",
     "torch.var(x, dim=(1, 2), unbiased=False, keepdim=True) * 8192.0"),
    # BatchNorm and LayerNorm written out, x - mean read twice
    (
        "(x - x.mean((0, 2), keepdim=True)) / torch.sqrt(((x - x.mean((0, 2), keepdim=True)) ** 2).mean((0, 2), keepdim=True) + 1e-5)",
        "(x - x.mean((0, 2), keepdim=True)) / torch.sqrt(x.var((0, 2), keepdim=True, unbiased=False) + 1e-5)",
    ),
    (
        "(lambda m: (x - m) / torch.sqrt(((x - m) ** 2).mean(-1, keepdim=True) + 1e-5))(x.mean(-1, keepdim=True))",
        "(x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + 1e-5)",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("written", "var"), CENTERED)
def test_a_mean_of_squared_deviations_is_the_biased_var(written: str, var: str, tmp_path: Path) -> None:
    """The kernel is the var form's, byte for byte."""
    test_a_chain_of_reductions_is_the_one_reduction_it_is(written, var, tmp_path)


@pytest.mark.parametrize(("written", "var"), CENTERED)
def test_a_folded_mean_of_squared_deviations_computes_what_the_written_one_does(written: str, var: str) -> None:
    """Folded, the graph's values are the model's (float64, CPU), spikes included."""
    import torch
    from torch import fx, nn
    from torch.fx.passes.shape_prop import ShapeProp

    from llmcompile.agent.patterns.idioms import fold_idioms

    class Model(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return eval(written, {"torch": torch, "x": x})  # (globals: a lambda in it reads x)

    x = torch.randn(4, 32, 256, dtype=torch.float64) * 3.0 + 100.0
    x[1, 2, 3] = 1e4
    gm = fx.symbolic_trace(Model())
    ShapeProp(gm).propagate(x)
    assert fold_idioms(gm) and any(n.target is torch.var for n in gm.graph.nodes)
    assert torch.allclose(gm(x), Model()(x), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    "forward",
    [
        "((x - x.mean(-1, keepdim=True)) ** 2).mean(1)",  # (other dims than the mean's)
        "((x - x.mean(-1, keepdim=True)) ** 3).mean(-1)",
        "((x - x.mean(0, keepdim=True)) ** 2).sum(0)",  # (var times the batch, which changes)
        "((x - x.abs().mean(-1, keepdim=True)) ** 2).mean(-1)",  # (the mean of another tensor)
        "((x.mean(-1, keepdim=True) - x) * (x - x.mean(-1, keepdim=True))).mean(-1)",
        "((x - x.mean(-1, keepdim=True)) ** 2).mean(-1, dtype=torch.float64)",
    ],
)
def test_what_only_looks_like_a_var_is_left_as_written(forward: str) -> None:
    test_a_chain_of_other_kinds_or_keepdims_is_left_as_written(forward)
