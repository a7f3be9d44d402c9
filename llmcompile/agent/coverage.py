"""What the offline default takes: every torch reduction along every kind of dim, the softmaxes
along each dim, a prologue, an epilogue that uses a statistic, two outputs from one read, and
each dtype, each written as a small KernelBench-format problem and put to the matcher
(`patterns.match`). The table is what the matcher says today, not a list kept by hand:
`llmcompile coverage` prints it, and docs/coverage.md is its output.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

# (label, the expression over `x`, with {d} the dims and {k} keepdim)
REDUCTIONS: tuple[tuple[str, str], ...] = (
    ("sum", "torch.sum(x, dim={d}, keepdim={k})"),
    ("mean", "torch.mean(x, dim={d}, keepdim={k})"),
    ("amax", "torch.amax(x, dim={d}, keepdim={k})"),
    ("amin", "torch.amin(x, dim={d}, keepdim={k})"),
    ("max (values)", "torch.max(x, dim={d1}, keepdim={k})[0]"),
    ("max (indices)", "torch.max(x, dim={d1}, keepdim={k})[1]"),
    ("min (values)", "torch.min(x, dim={d1}, keepdim={k})[0]"),
    ("argmax", "torch.argmax(x, dim={d1}, keepdim={k})"),
    ("argmin", "torch.argmin(x, dim={d1}, keepdim={k})"),
    ("prod", "torch.prod(x, dim={d1}, keepdim={k})"),
    ("var (unbiased)", "torch.var(x, dim={d}, keepdim={k})"),
    ("var (biased)", "torch.var(x, dim={d}, unbiased=False, keepdim={k})"),
    ("std", "torch.std(x, dim={d}, keepdim={k})"),
    ("logsumexp", "torch.logsumexp(x, dim={d}, keepdim={k})"),
    ("norm p=1", "torch.norm(x, p=1, dim={d}, keepdim={k})"),
    ("norm p=2", "torch.norm(x, p=2, dim={d}, keepdim={k})"),
    ("norm p=inf", "torch.linalg.vector_norm(x, ord=float('inf'), dim={d}, keepdim={k})"),
    ("norm p=3", "torch.linalg.vector_norm(x, ord=3, dim={d}, keepdim={k})"),
    ("norm p=0.5", "torch.norm(x, p=0.5, dim={d}, keepdim={k})"),
    ("norm p=-inf", "torch.linalg.vector_norm(x, ord=float('-inf'), dim={d}, keepdim={k})"),
    ("norm fro", "torch.norm(x, p='fro', dim={d}, keepdim={k})"),
    ("all", "torch.all(x > 0, dim={d1}, keepdim={k}).float()"),
    ("any", "torch.any(x > 0, dim={d1}, keepdim={k}).float()"),
    ("count_nonzero", "torch.count_nonzero(x > 0, dim={d}).float()"),
    ("nansum", "torch.nansum(x, dim={d}, keepdim={k})"),
    ("nanmean", "torch.nanmean(x, dim={d}, keepdim={k})"),
    ("aminmax (both)", "torch.aminmax(x, dim={d1}, keepdim={k})"),
)

# (label, dims as written for a (B, C, L) input, the single dim where an op takes one)
DIMS: tuple[tuple[str, str, str], ...] = (
    ("last", "-1", "-1"),
    ("middle", "1", "1"),
    ("first (batch)", "0", "0"),
    ("several (1, 2)", "(1, 2)", ""),
    ("batch statistics (0, 2)", "(0, 2)", ""),
    ("whole tensor", "(0, 1, 2)", ""),
)

# calls torch refuses (a Frobenius norm over three dims)
NOT_TORCH = {("norm fro", "whole tensor")}

# the whole tensor's call of an op that takes one dim: the same call without it
WHOLE_CALLS = {
    "max (values)": "torch.max(x)",
    "min (values)": "torch.min(x)",
    "argmax": "torch.argmax(x)",
    "argmin": "torch.argmin(x)",
    "prod": "torch.prod(x)",
    "all": "torch.all(x > 0).float()",
    "any": "torch.any(x > 0).float()",
    "aminmax (both)": "torch.aminmax(x)",
}

# the softmaxes and the forms the issue names: a prologue, an epilogue using a statistic, two outputs
FORMS: tuple[tuple[str, str], ...] = (
    ("sum of the whole tensor, x.sum()", "x.sum()"),
    ("mean of the whole tensor, x.mean()", "x.mean()"),
    ("softmax, last dim", "torch.softmax(x, dim=-1)"),
    ("softmax, middle dim", "torch.softmax(x, dim=1)"),
    ("softmax, first dim", "torch.softmax(x, dim=0)"),
    ("log_softmax, last dim", "torch.log_softmax(x, dim=-1)"),
    ("log_softmax, middle dim", "torch.log_softmax(x, dim=1)"),
    ("softmax written out, middle dim", "torch.exp(x - x.amax(1, keepdim=True)) / "
     "torch.exp(x - x.amax(1, keepdim=True)).sum(1, keepdim=True)"),
    ("a prologue: sum of x * x, last dim", "torch.sum(x * x, dim=-1)"),
    ("a prologue: mean of relu(x), middle dim", "torch.mean(torch.relu(x), dim=1)"),
    ("an epilogue: x / amax(|x|) * 127, last dim", "x / torch.amax(torch.abs(x), dim=-1, keepdim=True) * 127.0"),
    ("an epilogue: x / ||x||_2, last dim", "x / torch.norm(x, p=2, dim=-1, keepdim=True)"),
    ("an epilogue: x / ||x||_2, middle dim", "x / torch.norm(x, p=2, dim=1, keepdim=True)"),
    ("an epilogue: (x - mean) / std, last dim", "(x - x.mean(-1, keepdim=True)) / x.std(-1, keepdim=True)"),
    ("an epilogue: (x - mean) / std, middle dim", "(x - x.mean(1, keepdim=True)) / x.std(1, keepdim=True)"),
    ("two outputs: x / rms and rms, last dim", "x / torch.sqrt((x * x).mean(-1, keepdim=True)), "
     "torch.sqrt((x * x).mean(-1, keepdim=True))"),
    ("two outputs: x + y and its norm, last dim", "x + y, torch.norm(x + y, dim=-1)"),
    ("two outputs: max and its index, last dim", "torch.max(x, dim=-1)"),
    ("two outputs: min and its index, middle dim", "torch.min(x, dim=1)"),
    ("two outputs: var and mean, torch.var_mean, last dim", "torch.var_mean(x, dim=-1)"),
    ("two outputs: var and mean, torch.var_mean, first dim", "torch.var_mean(x, dim=0)"),
    ("two outputs: var and mean of the whole tensor, torch.var_mean(x)", "torch.var_mean(x)"),
    ("a chain: a mean of means, x.mean(-1).mean(-1)", "x.mean(-1).mean(-1)"),
    ("a shape read: x.sum(-1) / x.shape[-1]", "x.sum(-1) / x.shape[-1]"),
    ("a flattened view: x.view(x.size(0), -1).amax(-1)", "x.view(x.size(0), -1).amax(-1)"),
    ("a flattened batch: x.view(-1, 256).softmax(-1)", "x.view(-1, 256).softmax(-1)"),
    ("a scan: torch.cumsum(x, -1)", "torch.cumsum(x, -1)"),
    ("a scan: torch.logcumsumexp(x, -1)", "torch.logcumsumexp(x, -1)"),
    ("a scan: torch.cummax(x, -1).values", "torch.cummax(x, -1).values"),
    ("a scan along a middle dim: torch.cumsum(x, 1)", "torch.cumsum(x, 1)"),
    ("a scan along the first dim: torch.logcumsumexp(x, 0)", "torch.logcumsumexp(x, 0)"),
    ("a flattened batch: F.layer_norm(x.view(-1, 256), (256,))", "F.layer_norm(x.view(-1, 256), (256,))"),
    ("BatchNorm written out: (x - mean) / sqrt(var + eps) over (0, 2)",
     "(x - x.mean((0, 2), keepdim=True)) / torch.sqrt(x.var((0, 2), keepdim=True, unbiased=False) + 1e-5)"),
    ("a var written out: ((x - mean) ** 2).mean(), last dim", "((x - x.mean(-1, keepdim=True)) ** 2).mean(-1)"),
    ("LayerNorm written out: (x - mean) / sqrt(mean((x - mean) ** 2) + eps), last dim",
     "(x - x.mean(-1, keepdim=True)) / torch.sqrt((x - x.mean(-1, keepdim=True)).pow(2).mean(-1, keepdim=True) + 1e-5)"),
    ("two folds in one trip: amax - amin, middle dim", "x.amax(1) - x.amin(1)"),
    ("two folds in one trip: logsumexp - mean, first dim", "torch.logsumexp(x, 0) - x.mean(0)"),
    ("a chain: each row's logsumexp, then their mean", "torch.logsumexp(x, -1).mean()"),
    ("a chain: a mean distance, (x - y).pow(2).sum(-1).sqrt().mean()", "(x - y).pow(2).sum(-1).sqrt().mean()"),
    ("torch's shorthand: F.rms_norm, last dim", "F.rms_norm(x, (256,), eps=1e-6)"),
    ("torch's shorthand: F.layer_norm, last dim", "F.layer_norm(x, (256,))"),
    ("torch's shorthand: F.normalize, middle dim", "F.normalize(x, dim=1)"),
    ("torch's shorthand: F.softmin, last dim", "F.softmin(x, dim=-1)"),
)  # fmt: skip

DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")
SHAPE = (64, 32, 256)


@dataclass
class Cell:
    """One form put to the matcher: the template that takes it, or why none does."""

    form: str
    where: str
    dtype: str
    pattern: str | None
    reason: str


def _problem(expr: str, dtype: str, two: bool = False) -> str:
    shape = ", ".join(map(str, SHAPE))
    args = "x, y" if two else "x"
    inputs = ", ".join(f"torch.randn({shape}, dtype=torch.{dtype})" for _ in range(2 if two else 1))
    return (
        "import torch\nfrom torch import nn\nfrom torch.nn import functional as F\n\n\nclass Model(nn.Module):\n"
        f"    def forward(self, {args}):\n        return {expr}\n\n\n"
        f"def get_inputs():\n    return [{inputs}]\n\n\ndef get_init_inputs():\n    return []\n"
    )


def cases(dtypes: tuple[str, ...]) -> Iterator[tuple[str, str, str, str]]:
    """(form, where, dtype, source) for every form of the table."""
    for label, expr in REDUCTIONS:
        for where, dims, single in DIMS:
            call = WHOLE_CALLS.get(label, expr) if where == "whole tensor" else expr
            if "{d1}" in call and not single or (label, where) in NOT_TORCH:
                continue  # (an op that takes one dim; a call torch itself refuses)
            for dtype in dtypes:
                yield label, where, dtype, _problem(call.format(d=dims, d1=single, k=False), dtype)
    for label, expr in FORMS:
        for dtype in dtypes:
            yield label, "", dtype, _problem(expr, dtype, two=re.search(r"\by\b", expr) is not None)


def survey(dtypes: tuple[str, ...] = DTYPES, progress: Callable[[int], None] = lambda i: None) -> list[Cell]:
    """Every form of the table, as the matcher sees it now."""
    from llmcompile.agent import patterns
    from llmcompile.specs import OpError
    from llmcompile.specs.kernelbench import load_problem

    cells = []
    with tempfile.TemporaryDirectory(prefix="llmcompile-coverage-") as d:
        for i, (form, where, dtype, src) in enumerate(cases(dtypes)):
            path = Path(d) / f"p{i}.py"
            path.write_text(src)
            try:
                m = patterns.match(load_problem(path))
            except OpError as e:
                cells.append(Cell(form, where, dtype, None, f"not loaded: {e}".replace(str(path), "the problem")))
            else:
                taken = isinstance(m, patterns.Match)
                cells.append(Cell(form, where, dtype, m.pattern if taken else None, "" if taken else m.reason))
            progress(i + 1)
    return cells


def count(dtypes: tuple[str, ...] = DTYPES) -> int:
    return sum(1 for _ in cases(dtypes))


def table(cells: list[Cell]) -> str:
    """Markdown: reductions by dim (the template, or "-" and a numbered reason), then the other
    forms; a form is "taken" where every dtype asked is, and a dtype that differs is named."""
    reasons: dict[str, int] = {}

    def cell(group: list[Cell]) -> str:
        if not group:
            return ""
        taken = {c.pattern for c in group if c.pattern}
        missing = [c for c in group if not c.pattern]
        if not missing:
            return ", ".join(sorted(taken))
        why = missing[0].reason
        k = reasons.setdefault(why, len(reasons) + 1)
        some = f"{', '.join(sorted(taken))} except {', '.join(c.dtype for c in missing)}; " if taken else ""
        return f"{some}- ({k})"

    wheres = [w for w, _, _ in DIMS]
    lines = ["| reduction | " + " | ".join(wheres) + " |", "|---|" + "---|" * len(wheres)]
    for label, _ in REDUCTIONS:
        row = [cell([c for c in cells if c.form == label and c.where == w]) for w in wheres]
        lines.append(f"| {label} | " + " | ".join(r or "n/a" for r in row) + " |")
    lines += ["", "| form | taken by |", "|---|---|"]
    for label, _ in FORMS:
        lines.append(f"| {label} | {cell([c for c in cells if c.form == label])} |")
    lines += ["", taken_line(cells), ""]
    lines += [f"({k}) {why}" for why, k in reasons.items()]
    return "\n".join(lines) + "\n"


def taken_line(cells: list[Cell]) -> str:
    taken = sum(1 for c in cells if c.pattern)
    return f"{taken} of {len(cells)} problems taken (dtypes: {', '.join(sorted({c.dtype for c in cells}))})."


def document(cells: list[Cell]) -> str:
    """docs/coverage.md: the table with what it is and how it was made."""
    shape = " x ".join(map(str, SHAPE))
    return (
        "# What the offline default takes\n\n"
        "Each form below was written as a small KernelBench-format problem (inputs of shape "
        f"{shape}) and put to the pattern matcher, which either names the template that writes its "
        "kernel or says why none does. Written by `llmcompile coverage --out docs/coverage.md` "
        "(tests/test_agent_coverage.py fails when this file is not what the matcher says now). "
        "A form not taken can still be written by an LLM (`--llm openai`).\n\n" + table(cells)
    )


README_START, README_END = "<!-- coverage: llmcompile coverage --readme README.md -->", "<!-- /coverage -->"


def readme(text: str, cells: list[Cell]) -> str:
    """`text` (the README) with the count between its coverage markers written anew (the table
    is docs/coverage.md's: reference, not the five-minute read)."""
    start, end = text.index(README_START) + len(README_START), text.index(README_END)
    lead = "Each form:" if all(c.pattern for c in cells) else "Each form, and why one is not taken:"
    return text[:start] + "\n" + taken_line(cells) + f" {lead}\n" + text[end:]
