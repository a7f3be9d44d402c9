"""Render the prompts in prompts/ (jinja2) and pull the code out of an answer."""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Any

from llmcompile.agent.render import interface_source, reference_source, render
from llmcompile.specs import BUILTIN, OpSpec, contract
from llmcompile.specs.targets import Target

_CODE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.S)


def references_for(spec: OpSpec, limit: int = 2) -> list[tuple[str, str]]:
    """The reference kernels most relevant to `spec`: its own, then the closest relatives
    (norms teach norms; softmax teaches any row reduction with an elementwise epilogue)."""
    names: list[str] = []
    if spec.reference_module:
        names.append(spec.reference_module)
    text = (spec.name + " " + spec.summary + " " + spec.torch_expr).lower()
    for key, mod in (("norm", "rmsnorm"), ("layer_norm", "layernorm"), ("loss", "cross_entropy"), ("", "softmax")):
        if key in text and mod not in names:
            names.append(mod)
    return [(n, reference_source(n)) for n in names[:limit]]


@dataclass
class PromptContext:
    spec: OpSpec
    dtype: str
    target: Target
    target_pct: float
    sol_tbs: float | None = None
    shapes: list[tuple[int, int]] | None = None  # benchmark shapes; None: the spec's own

    def shape_work(self) -> list[tuple[int, int, float]]:
        """Each benchmark shape with what its rate divides: bytes moved, or FLOPs (compute-bound)."""
        return [(m, n, self.spec.work(m, n, self.dtype)) for m, n in self.shapes or self.spec.shapes()]


def _cute_version() -> str:
    try:
        from importlib.metadata import version

        return version("nvidia-cutlass-dsl")
    except Exception:  # noqa: BLE001
        return ""


def system_prompt(ctx: PromptContext) -> str:
    return render(
        "system.md.j2",
        target=ctx.target,
        contract=(contract.__doc__ or "").strip(),
        cute_version=_cute_version(),
        sol_tbs=ctx.sol_tbs,
        compute=ctx.spec.compute_bound,
    )


def template_for(spec: OpSpec) -> tuple[str, list[tuple[str, str]]]:
    """The template the prompt carries and its reference kernels: for a custom problem whose
    graph matches a pattern, that pattern's template and the kernel instantiating it (an
    example the model can improve on); else the row-reduction template and its relatives."""
    if spec.compute_bound and spec.reference_module:
        # (the template is itself the reference kernel; its softmax lives in its own file)
        return "attention", [
            ("attention_softmax: the online softmax it imports", reference_source("attention_softmax"))
        ]
    if spec.source_path:
        from llmcompile.agent import patterns

        m = patterns.match(spec)
        if isinstance(m, patterns.Match) and m.jinja:
            # (the rows wrapper's template is the reference kernel it views the input for)
            template = m.context.get("op", m.pattern) if m.pattern == "rows" else m.pattern
            return template, [(f"{m.pattern}: {m.summary} (written from this problem's graph)", m.source)]
    return "reduce", references_for(spec)


# The row template's modules, under one import (`reference_kernels.reduce as R`), shown to the
# model as interfaces: the reference kernels beside them show the bodies' use.
ROW_TEMPLATE = ("row_plan", "row_io", "reduce")


def template_source(template: str) -> str:
    """What the prompt shows of `template`: the row template's interfaces, else the source."""
    if template != "reduce":
        return reference_source(template)
    return "\n\n".join(f"# ---- reference_kernels/{m}.py\n" + interface_source(m).rstrip() for m in ROW_TEMPLATE)


def task_prompt(ctx: PromptContext) -> str:
    template, references = template_for(ctx.spec)
    return render(
        "task.md.j2",
        spec=ctx.spec,
        dtype=ctx.dtype,
        target=ctx.target,
        shapes=ctx.shape_work(),
        target_pct=ctx.target_pct,
        sol_tbs=ctx.sol_tbs,
        template_name=template,
        template_source=template_source(template),
        references=references,
    )


def feedback_prompt(verdict: Any, best: Any, target_pct: float) -> str:
    return render("feedback.md.j2", verdict=verdict, best=best, target_pct=target_pct)


def extract_code(answer: str) -> str | None:
    """The longest fenced Python block (answers often quote snippets before the module)."""
    blocks = _CODE.findall(answer)
    if not blocks:
        return answer if "@cute.kernel" in answer and "```" not in answer else None
    return max(blocks, key=len).strip() + "\n"


def attention_variant(spec: OpSpec, knobs: str, tag: str) -> str:
    """The reference attention kernel of `spec` with other tile sizes (`knobs`: AttentionKnobs
    fields, as source), as a contract module."""
    assert spec.compute_bound and spec.reference_module
    return render(
        "attention_variant.py.j2",
        reference_source=reference_source(spec.reference_module).rstrip(),
        knobs=knobs,
        tag=tag,
        causal=spec.causal,
    )


def attention_sm80_variant(spec: OpSpec) -> str:
    """The Ampere attention kernel as a contract module for `spec` (its causality)."""
    assert spec.compute_bound and spec.reference_module
    return render(
        "attention_sm80_variant.py.j2", source=reference_source("attention_sm80").rstrip(), causal=spec.causal
    )


def offline_variant(spec: OpSpec, knobs_by_n: dict[int, str], tag: str) -> str:
    """The reference kernel of `spec` with per-N knob overrides, as a contract module."""
    assert spec.reference_module and spec.reference_module in {s.reference_module for s in BUILTIN.values()}
    params = [f"m{t.name.capitalize()}" for t in spec.tensors]
    if contract.workspace_of(importlib.import_module(f"reference_kernels.{spec.reference_module}")):
        params.append("mWork")  # the contract's scratch tensor, right after the outputs
    params += [*spec.scalars, "stream"]
    return render(
        "offline_variant.py.j2",
        reference_source=reference_source(spec.reference_module).rstrip(),
        knobs=knobs_by_n,
        tag=tag,
        params=params,
        first=params[0],
        ndim=len(spec.tensors[0].dims),
    )
