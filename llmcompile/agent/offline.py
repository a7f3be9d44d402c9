"""The offline provider: no LLM. It proposes variants of the op's reference kernel over its
tuning knobs, one knob set per benchmark N, and moves each N towards what the harness
measured fastest (coordinate search: change one knob of the best set at a time).

Custom ops (KernelBench files) are matched to a pattern template from their torch graph
(`patterns.match`); the kernel that instantiates the template is proposed first, then its
knob variants (`TEMPLATE_KNOBS`). A problem that matches no template is not attempted, and
the reason says which part of its graph no template covers.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from llmcompile.agent import prompting
from llmcompile.agent.providers import Answer, Message, ProviderError, Slot, Usage
from llmcompile.specs import OpSpec
from reference_kernels import row_plan as R  # (the knobs alone: no CuTe DSL in the agent process)

THREADS_PER_ROW = (8, 16, 32, 64, 128, 256)
NUM_THREADS = (128, 256)
CLUSTER_N = (1, 2, 4, 8, 16)
ROW_LOOP = (1, 2, 4, 8)


def knobs_repr(k: R.RowKnobs) -> str:
    base = R.RowKnobs()
    parts = [
        f"{f.name}={getattr(k, f.name)!r}" for f in dataclasses.fields(k) if getattr(k, f.name) != getattr(base, f.name)
    ]
    return f"RowKnobs({', '.join(parts)})"


def neighbours(k: R.RowKnobs, columns: bool = False) -> list[R.RowKnobs]:
    """Knob sets one step from `k`, most promising first (staging, how per-column vectors
    are loaded, thread shape: they moved the most on the H100). `columns`: the op has
    per-column vectors (a norm's weight), so RowKnobs.columns matters."""
    out: list[R.RowKnobs] = []
    if columns:
        out += [dataclasses.replace(k, columns=c) for c in R.COLUMN_MODES if c != k.columns]
    for s in (True, False, None):
        if s != k.stage_smem:
            out.append(dataclasses.replace(k, stage_smem=s))
    for t in NUM_THREADS:
        if t != k.num_threads:
            out.append(dataclasses.replace(k, num_threads=t))
    for tpr in THREADS_PER_ROW:
        if tpr != k.threads_per_row:
            nt = max(k.num_threads or 128, tpr)
            out.append(dataclasses.replace(k, threads_per_row=tpr, num_threads=nt))
    for c in CLUSTER_N:
        if c != k.cluster_n:
            out.append(dataclasses.replace(k, cluster_n=c))
    for r in ROW_LOOP:
        if r != k.row_loop:
            out.append(dataclasses.replace(k, row_loop=r))
    if (k.row_loop or 1) > 1:
        out.append(dataclasses.replace(k, prefetch_registers=not k.prefetch_registers))
    out.append(dataclasses.replace(k, online=not k.online))
    return out


def valid(k: R.RowKnobs, n: int, width_bits: int) -> bool:
    try:
        R.resolve_tiling(k, width_bits, n)
    except ValueError:
        return False
    return True


@dataclass
class _PerN:
    best: R.RowKnobs
    best_tbs: float = 0.0
    tried: set[str] = field(default_factory=set)


# Knob variants tried after a template's default, most promising first (what moved the
# most on the H100: loads in flight per thread, then CTA shape).
TEMPLATE_KNOBS: dict[str, tuple[str, ...]] = {
    "map": ("unroll=8", "unroll=2", "num_threads=128", "num_threads=512, unroll=2", "vec_bits=64"),
    "strided": ("unroll=2", "unroll=8", "threads_r=1", "threads_r=8", "num_threads=512", "num_threads=128"),
    "scan": ("per_thread=8", "per_thread=2", "num_threads=128", "num_threads=512", "prefetch=False"),
}


class TemplateSearch:
    """The offline provider for a custom op that matches a pattern template: the matched
    kernel, then one knob variant per slot."""

    name = "offline"
    uses_llm = False

    def __init__(self, spec: OpSpec, match: Any) -> None:
        self.spec, self.match = spec, match
        self.variants = [""] + list(TEMPLATE_KNOBS.get(match.pattern, ()))
        self.next = 0

    def propose(self, conversations: Sequence[list[Message]], slots: Sequence[Slot]) -> list[Answer]:
        from llmcompile.agent import patterns

        answers: list[Answer] = []
        for _slot in slots:
            if self.next >= len(self.variants):
                break
            knobs = self.variants[self.next]
            self.next += 1
            src = self.match.source if not knobs else patterns.render(self.spec, self.match, knobs)
            note = f"matched {self.match.pattern}: {self.match.summary}" + (f"; knobs {knobs}" if knobs else "")
            text = f"Offline template (no LLM was used): {note}\n\n```python\n{src}```\n"
            answers.append(Answer(text, Usage(), "offline-template", 0.0, {"knobs": knobs}))
        return answers

    def describe(self) -> str:
        return f"the {self.match.pattern} template, matched from the torch graph: {self.match.summary}"

    def observe(self, slot: Slot, answer: Answer, verdict: Any) -> None:
        pass


# Launch orders and tile sizes tried on attention after the shipped ones: head groups as large
# as L2 holds (causal: longest first across them), of 8 and of 1 (each head in turn: the
# non-causal default, so tried on causal ops only), then the tile sizes that build without
# spills or ptxas-inserted warpgroup waits (key tiles of 160-192 spill, ptxas reporting the 168
# registers a thread that 384 threads allow; 96 and 112 get waits inserted).
ATTENTION_KNOBS = ("head_group=0", "head_group=8", "head_group=1", "stages=3", "block_n=64", "block_n=64, stages=4")
CAUSAL_ONLY = ("head_group=1",)


def knob_fields(knobs: str) -> dict[str, Any]:
    """One of ATTENTION_KNOBS ("block_n=64, stages=4": AttentionKnobs fields as the variant's
    source writes them) as keyword arguments."""
    return {k: ast.literal_eval(v) for k, v in (kv.split("=") for kv in knobs.split(", "))}


# The Ampere kernel (reference_kernels/attention_sm80.py, cp.async + mma.sync), offered last:
# the one candidate for a GPU without warpgroup MMA.
SM80 = "sm80"


class AttentionSearch:
    """The offline provider for attention: the reference kernel as shipped, then its other tile
    sizes, then the Ampere kernel, one a slot (one set for every N: the loop keeps whichever
    the judge times best)."""

    name = "offline"
    uses_llm = False

    def __init__(self, spec: OpSpec) -> None:
        self.spec = spec
        self.variants = ["", *(k for k in ATTENTION_KNOBS if spec.causal or k not in CAUSAL_ONLY), SM80]
        self.next = 0

    def propose(self, conversations: Sequence[list[Message]], slots: Sequence[Slot]) -> list[Answer]:
        answers: list[Answer] = []
        for slot in slots:
            if self.next >= len(self.variants):
                break
            knobs = self.variants[self.next]
            self.next += 1
            if knobs == SM80:
                src = prompting.attention_sm80_variant(self.spec)
                note = "the Ampere kernel (cp.async, mma.sync)"
            elif knobs:
                src = prompting.attention_variant(self.spec, knobs, f"r{slot.round}s{slot.sample}")
                note = f"AttentionKnobs({knobs})"
            else:
                src, note = (
                    prompting.reference_source(self.spec.reference_module or ""),
                    "the reference kernel as shipped",
                )
            text = f"Offline search (no LLM was used): {note}\n\n```python\n{src}```\n"
            answers.append(Answer(text, Usage(), "offline-search", 0.0, {"knobs": knobs}))
        return answers

    def describe(self) -> str:
        return "trying the reference attention kernel's tile sizes"

    def observe(self, slot: Slot, answer: Answer, verdict: Any) -> None:
        pass


def offline_provider(spec: OpSpec, dtype: str, shapes: list[tuple[int, int]] | None = None):
    """The offline default for `spec`: the knob search of a built-in op's reference kernel (the
    tile sizes of attention's), or the template a custom op's graph matches; ProviderError (not
    attempted) otherwise."""
    if spec.compute_bound and spec.reference_module:
        return AttentionSearch(spec)
    if spec.reference_module:
        return OfflineProvider(spec, dtype, shapes)
    from llmcompile.agent import patterns

    m = patterns.match(spec)
    if isinstance(m, patterns.NoMatch):
        raise ProviderError(
            f"{spec.name}: the offline default matched no kernel template ({m.reason}); "
            "give an LLM endpoint (--llm openai --model ... with OPENAI_API_KEY) for it"
        )
    return TemplateSearch(spec, m)


class OfflineProvider:
    name = "offline"
    uses_llm = False

    def __init__(self, spec: OpSpec, dtype: str, shapes: list[tuple[int, int]] | None = None) -> None:
        if not spec.reference_module:
            raise ProviderError(
                f"{spec.name} is a custom op: the reference-kernel search only tunes the built-in ops "
                "(offline_provider matches custom ops to templates)"
            )
        self.spec = spec
        self.dtype = dtype
        mod = importlib.import_module(f"reference_kernels.{spec.reference_module}")
        self.default: R.RowKnobs = getattr(mod.launch, "knobs", R.RowKnobs())
        self.width = {"float32": 32, "bfloat16": 16, "float16": 16}[dtype]
        self.columns = any(t.dims == ("N",) for t in spec.inputs)
        self.ns = sorted({n for _, n in shapes or spec.shapes()})
        self.state = {n: _PerN(self.default) for n in self.ns}

    def describe(self) -> str:
        return "tuning the reference kernel's knobs"

    def _next_for(self, n: int, taken: set[str]) -> R.RowKnobs | None:
        st = self.state[n]
        for k in neighbours(st.best, self.columns):
            r = knobs_repr(k)
            if r not in st.tried and r not in taken and valid(k, n, self.width):
                return k
        return None

    def propose(self, conversations: Sequence[list[Message]], slots: Sequence[Slot]) -> list[Answer]:
        answers: list[Answer] = []
        taken: dict[int, set[str]] = {n: set() for n in self.ns}
        for slot in slots:
            if slot.round == 0 and slot.sample == 0:
                src = prompting.reference_source(self.spec.reference_module or "")
                sets = {n: self.default for n in self.ns}
                note = "the reference kernel as shipped"
            else:
                chosen: dict[int, R.RowKnobs] = {}
                for n in self.ns:
                    k = self._next_for(n, taken[n])
                    if k is not None:
                        chosen[n] = k
                        taken[n].add(knobs_repr(k))
                if not chosen:
                    break  # every neighbour of every best set has been measured
                sets = {n: chosen.get(n, self.state[n].best) for n in self.ns}
                src = prompting.offline_variant(
                    self.spec, {n: knobs_repr(k) for n, k in sets.items()}, f"r{slot.round}s{slot.sample}"
                )
                note = "knobs per N: " + "; ".join(f"N={n}: {knobs_repr(k)}" for n, k in sets.items())
            text = f"Offline search (no LLM was used): {note}\n\n```python\n{src}```\n"
            meta = {"knobs": {str(n): dataclasses.asdict(k) for n, k in sets.items()}}
            answers.append(Answer(text, Usage(), "offline-search", 0.0, meta))
        return answers

    def observe(self, slot: Slot, answer: Answer, verdict: Any) -> None:
        knobs = {int(n): R.RowKnobs(**k) for n, k in answer.meta.get("knobs", {}).items()}
        for n, k in knobs.items():
            if n in self.state:
                self.state[n].tried.add(knobs_repr(k))
        if verdict is None or not getattr(verdict, "passed", False) or not verdict.profile:
            return
        for s in verdict.profile.shapes:
            st = self.state.get(s.n)
            if st is not None and s.tbs > st.best_tbs and s.n in knobs:
                st.best_tbs = s.tbs
                st.best = knobs[s.n]
