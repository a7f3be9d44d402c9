"""The matcher never raises: random small torch programs over the ops it knows (and some it does
not), each written as a KernelBench-format file, end as a kernel or as "not attempted" with a
reason, never as a traceback."""

from __future__ import annotations

import random
from pathlib import Path

from llmcompile.agent import patterns
from llmcompile.harness.static import check_source
from llmcompile.specs import OpError
from llmcompile.specs.kernelbench import load_problem

UNARY = (
    "torch.relu({a})", "torch.sigmoid({a})", "torch.tanh({a})", "torch.exp({a})", "torch.abs({a})",
    "F.gelu({a})", "F.softplus({a})", "F.silu({a})", "torch.neg({a})", "F.leaky_relu({a}, 0.2)",
    "F.elu({a})", "F.hardtanh({a})", "torch.sqrt(torch.abs({a}))", "torch.log(torch.abs({a}) + 1.0)",
    "torch.clamp({a}, min=-0.5)", "({a} * 2.0)", "({a} ** 2)", "({a} + 1.0)", "torch.rsqrt({a} * {a} + 1.0)",
)  # fmt: skip
BINARY = ("({a} + {b})", "({a} * {b})", "({a} - {b})", "({a} / (torch.abs({b}) + 1.0))")
REDUCTIONS = (
    "torch.sum({a}, dim={d}, keepdim={k})", "torch.mean({a}, dim={d}, keepdim={k})",
    "torch.amax({a}, dim={d}, keepdim={k})", "torch.amin({a}, dim={d}, keepdim={k})",
    "torch.max({a}, dim={d}, keepdim={k})[0]", "torch.min({a}, dim={d}, keepdim={k})[1]",
    "torch.argmax({a}, dim={d}, keepdim={k})", "torch.norm({a}, p=2, dim={d}, keepdim={k})",
    "torch.norm({a}, p=1, dim={d}, keepdim={k})", "torch.var({a}, dim={d}, keepdim={k})",
    "torch.std({a}, dim={d}, unbiased=False, keepdim={k})", "torch.logsumexp({a}, dim={d}, keepdim={k})",
    "torch.prod({a}, dim={d}, keepdim={k})", "{a}.sum()", "torch.sum({a}, dim={dd})",
    "torch.max({a}, dim={d})",
)  # fmt: skip
ALONG = (
    "torch.softmax({a}, dim={d})", "torch.log_softmax({a}, dim={d})", "torch.cumsum({a}, dim={d})",
    "torch.cumprod({a}, dim={d})", "torch.flip({a}, dims=[{d}])", "F.normalize({a}, dim={d})",
    "({a} / torch.sum(torch.abs({a}), dim={d}, keepdim=True))", "({a} / torch.amax(torch.abs({a}), dim={d}, keepdim=True) * 127.0)",
)  # fmt: skip


def _program(rng: random.Random) -> str:
    rank = rng.randint(2, 4)
    shape = [rng.choice((8, 16, 33)) if i == 0 else rng.choice((3, 4, 7, 16)) for i in range(rank)]
    two = rng.random() < 0.4
    values = ["x", "y"] if two else ["x"]
    body = []
    for i in range(rng.randint(1, 4)):
        a = rng.choice(values)
        kind = rng.random()
        d = rng.randrange(-rank, rank)
        if kind < 0.35:
            expr = rng.choice(UNARY).format(a=a)
        elif kind < 0.5 and two:
            expr = rng.choice(BINARY).format(a=a, b=rng.choice(values))
        elif kind < 0.75:
            dd = tuple(sorted(rng.sample(range(rank), 2)))
            expr = rng.choice(REDUCTIONS).format(a=a, d=d, k=rng.random() < 0.5, dd=dd)
        else:
            expr = rng.choice(ALONG).format(a=a, d=d)
        body.append(f"        v{i} = {expr}")
        values.append(f"v{i}")
    outs = values[-2:] if len(values) > 2 and rng.random() < 0.2 else values[-1:]
    args = "x, y" if two else "x"
    inputs = ", ".join(f"torch.randn({', '.join(map(str, shape))})" for _ in range(2 if two else 1))
    return (
        "import torch\nimport torch.nn.functional as F\nfrom torch import nn\n\n\nclass Model(nn.Module):\n"
        f"    def forward(self, {args}):\n" + "\n".join(body) + f"\n        return {', '.join(outs)}\n\n\n"
        f"def get_inputs():\n    return [{inputs}]\n\n\ndef get_init_inputs():\n    return []\n"
    )


def test_the_matcher_never_raises_on_generated_graphs(tmp_path: Path) -> None:
    rng = random.Random(45)
    loaded = matched = 0
    reasons: set[str] = set()
    for i in range(700):
        path = tmp_path / f"p{i:03d}.py"
        path.write_text(_program(rng))
        try:
            spec = load_problem(path)
        except OpError:
            continue  # not a problem the loader takes (e.g. an integer first input): said, not matched
        loaded += 1
        m = patterns.match(spec)  # must not raise
        if isinstance(m, patterns.Match):
            matched += 1
            assert check_source(m.source).ok, (path.read_text(), m.source)
        else:
            assert m.reason.startswith("no template"), (path.read_text(), m.reason)
            reasons.add(m.reason.split("(")[0][:60])
    assert loaded >= 500, loaded
    assert matched >= 50 and len(reasons) >= 5, (matched, sorted(reasons))


def test_a_problem_with_two_outputs_from_one_read_is_taken(tmp_path: Path) -> None:
    """Rows scaled by their absolute max, and that max (a quantization's two outputs): the norm
    template writes the rewrite and a value a row beside it."""
    path = tmp_path / "scale_rows.py"
    path.write_text(
        "import torch\nfrom torch import nn\n\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
        "        s = x.abs().amax(dim=-1, keepdim=True)\n        return x / s * 127.0, s\n\n\n"
        "def get_inputs():\n    return [torch.randn(64, 256)]\n\n\ndef get_init_inputs():\n    return []\n"
    )
    m = patterns.match(load_problem(path))
    assert isinstance(m, patterns.Match) and m.pattern == "norm", m
    assert "per_group=per_group" in m.source and "(out0, out1)" in m.source
