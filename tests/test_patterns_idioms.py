"""patterns/idioms.py: a softmax written out by hand is one fold on every template."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmcompile.agent import patterns
from llmcompile.specs import get_op
from tests.level1 import compiled_match, problem_file, right_on_gpu

E = "torch.exp(x - x.amax({d}, keepdim=True))"
WRITTEN = [
    ("softmax, last dim", f"{E} / {E}.sum({{d}}, keepdim=True)", "-1", "norm"),
    ("softmax through max(...)[0], middle dim", "(lambda e: e / e.sum(1, keepdim=True))"
     "(torch.exp(x - x.max(1, keepdim=True)[0]))", "1", "strided"),
    ("log_softmax, first dim", f"x - x.amax({{d}}, keepdim=True) - torch.log({E}.sum({{d}}, keepdim=True))", "0",
     "leading"),
    ("logsumexp, last dims", f"{E}.sum({{d}}).log() + x.amax({{d}})", "(1, 2)", "norm"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "forward", "d", "pattern"), WRITTEN)
def test_a_softmax_written_out_is_one_fold(what: str, forward: str, d: str, pattern: str, tmp_path: Path) -> None:
    src = problem_file(tmp_path, "w", forward.format(d=d).replace("{d}", d), "(16, 32, 256)")
    m, _ = compiled_match(src, "float32", tmp_path, pattern)
    assert m.source.count("S.max_sumexp") == 1 and "logsumexp" in m.summary, m.source


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
@pytest.mark.parametrize(("what", "forward", "d", "pattern"), WRITTEN)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_softmax_written_out_is_right(what: str, forward: str, d: str, pattern: str, dtype: str, tmp_path: Path):
    src = problem_file(tmp_path, "w", forward.format(d=d).replace("{d}", d), f"(64, 32, 256, dtype=torch.{dtype})")
    right_on_gpu(src, dtype, tmp_path, 41)


@pytest.mark.parametrize(("what", "forward", "d", "pattern"), WRITTEN)
def test_the_folded_graph_computes_what_the_written_one_does(what: str, forward: str, d: str, pattern: str) -> None:
    """The folded graph, in float64 on the CPU, gives the model's values (spikes included)."""
    import torch
    from torch import fx, nn
    from torch.fx.passes.shape_prop import ShapeProp

    from llmcompile.agent.patterns.idioms import fold_idioms

    body = forward.format(d=d).replace("{d}", d)

    class Model(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return eval(body, {"torch": torch}, {"x": x})

    x = torch.randn(4, 8, 64, dtype=torch.float64) * 30.0
    gm = fx.symbolic_trace(Model())
    ShapeProp(gm).propagate(x)
    assert fold_idioms(gm)
    assert torch.allclose(gm(x), Model()(x), rtol=1e-12, atol=1e-12)
