"""Match a problem's torch program to a kernel template, and write the kernel that instantiates it.

The problem's model is traced with torch.fx (on the meta device: no memory, no time) and its
graph is read as one of the shapes of work the templates in `reference_kernels/` implement:

- map: every node elementwise (activations, scalings, broadcasts of a per-row vector);
- strided: one reduction along a middle dim, with an elementwise prologue before it, an
  epilogue on its result and, for a norm, an elementwise rewrite of the input with it;
- scan: one cumsum, cumprod, logcumsumexp, cummax or cummin (its values) along the last dim
  (reversed by flips, a cumsum made exclusive by a shifted concatenation, with an elementwise
  prologue such as a mask);
- total: a whole tensor folded to a value (losses, a Frobenius norm and its rewrite), and the
  reduced losses whose rows come first (cross-entropy: the reference kernel's rows' losses;
  a triplet margin loss: the norm template's), folded by it;
- norm: statistics of groups then a rewrite (BatchNorm with batch statistics, as a module or
  written out, InstanceNorm, GroupNorm, LayerNorm over trailing dims, x rewritten with a
  statistic of its last dim), or a
  value a group (a matrix-vector product: rows folded against the vector; a sum, mean, max, min
  or norm of each row, and what the output makes of it);
- pool: max and average pooling modules over 1-3 spatial dims;
- attention_tf32: scaled_dot_product_attention of fp32 inputs with wide heads and short rows (the
  bf16/fp16 reference kernels are built-in ops of their own);
- softmax / log_softmax along the last dim: the reference kernels themselves (a longer input
  viewed as rows); along another dim, the log-sum-exp of that dim on the templates above.

A match renders a kernel module (prompts/candidates/*.py.j2) that the judge treats like any
candidate. Anything else is a `NoMatch` that says which node no template covers.

trace.py runs the front end (decompose.py writes torch's shorthands out first: F.rms_norm as
x * rsqrt(mean(x^2) + eps) * w; lift.py reads a view that merges x's dims, x.view(-1, N), in x's
own; idioms.py folds what is written by hand), graph.py reads the traced graph and emit.py writes
its elementwise parts as CuTe-DSL code; each family above has its own module; `_match` below
tries them in order (whole-graph calls of a known module first, then the rows, map, batch
statistics, total, norm, scan and strided shapes).
"""

from __future__ import annotations

from llmcompile.agent import render as templates
from llmcompile.agent.patterns.attention import match_attention
from llmcompile.agent.patterns.chain import match_rows_then_total
from llmcompile.agent.patterns.graph import (
    Match,
    NoMatch,
    Unsupported,
    describe,
    launch_params,
    results_of,
    split_nodes,
)
from llmcompile.agent.patterns.maps import match_map
from llmcompile.agent.patterns.norm import match_batch_statistics, match_gemv, match_norm_module, match_norm_of_rows
from llmcompile.agent.patterns.pool import match_pool
from llmcompile.agent.patterns.rows import match_rowop
from llmcompile.agent.patterns.scan import match_scan
from llmcompile.agent.patterns.strided import match_strided
from llmcompile.agent.patterns.total import match_cross_entropy, match_total, match_triplet
from llmcompile.agent.patterns.trace import trace
from llmcompile.specs import OpSpec

__all__ = ["Match", "NoMatch", "match", "render"]

# Graphs that are one call of a known module or function, tried first: (matcher, the template
# it instantiates, the jinja that writes it when not the template's own)
_WHOLE_GRAPH = (
    (match_norm_module, "norm", ""),
    (match_triplet, "total", "triplet_total"),
    (match_cross_entropy, "total", "cross_entropy_total"),
    (match_gemv, "norm", ""),
    (match_pool, "pool", ""),
    (match_attention, "attention_tf32", ""),
)


def match(spec: OpSpec) -> Match | NoMatch:
    """The template this problem's torch program matches, with its kernel; or why none does.
    Never raises: a graph the matcher itself cannot read is "not attempted", with the reason."""
    try:
        return _match(spec)
    except Exception as e:  # noqa: BLE001 - a gap in the matcher, never the user's traceback
        return NoMatch(f"no template matches this graph: the matcher stopped on it ({type(e).__name__}: {e})")


def _match(spec: OpSpec) -> Match | NoMatch:
    if not spec.source_path:
        return NoMatch(f"{spec.name} is a built-in op: its reference kernel is the offline default")
    try:
        gm, given, shapes = trace(spec)
        params = launch_params(spec)
        outs = {"outputs": [t.name for t in spec.outputs]}
        for matcher, pattern, jinja in _WHOLE_GRAPH:
            c = matcher(spec, gm, given, shapes)
            if c:
                return _rendered(pattern, c["what"], spec, params, {**c, **outs}, jinja)
        rows = match_rowop(spec, gm, given, shapes)
        if rows and rows["rank"] == 2 and not rows["reshaped"]:
            src = templates.reference_source(rows["op"])
            return Match(rows["op"], f"{rows['op']} along the last dim: the reference kernel", src)
        if rows:
            what = f"{rows['op']} along the last dim, rows of {rows['n']}: the reference kernel"
            return _rendered("rows", what, spec, params, {**rows, **outs, "x": spec.tensors[0].name})
        m = match_map(spec, gm, given, shapes)
        if m:
            ctx = {**m, "kinds_repr": repr(tuple(m["kinds"])), **outs}
            what = ", ".join(m["ops"]) or "copy"
            return _rendered("map", f"elementwise ({what}) over {', '.join(m['kinds'])} inputs", spec, params, ctx)
        b = match_batch_statistics(spec, gm, given, shapes)
        if b:
            return _rendered("norm", b["what"], spec, params, {**b, **outs})
        w = match_total(spec, gm, given, shapes)
        if w:
            ctx = {**w, **outs}
            what = f"{w['reduction']} of the whole tensor" + (" then a rewrite of x" if w["rewrite"] else "")
            return _rendered("total", what, spec, params, ctx)
        c = match_rows_then_total(spec, gm, given, shapes)
        if c:
            return _rendered("total", c["what"], spec, params, {**c, **outs}, "rows_total")
        g = match_norm_of_rows(spec, gm, given, shapes)
        if g:
            return _rendered("norm", g["what"], spec, params, {**g, **outs})
        s = match_scan(spec, gm, given, shapes)
        if s:
            how = " reversed" * s["reverse"] + " exclusive" * s["exclusive"]
            along = "the last dim" if s["dim"] is None else f"dim {s['dim']}"
            return _rendered("scan", f"{s['kind']}{how} along {along}", spec, params, s)
        r = match_strided(spec, gm, given, shapes)
        if r:
            dims = f"dims 0-{r['span'] - 1}" if r["span"] > 1 else f"dim {r['dim']}"
            what = f"{r['reduction']} over {dims} (R={r['r']})" + (" then a rewrite of x" if r["rewrite"] else "")
            return _rendered("leading" if r["lead"] else "strided", what, spec, params, {**r, **outs})
    except Unsupported as e:
        return NoMatch(f"no template takes {e}")
    _, calls, (out,) = split_nodes(gm)
    ops = sorted({describe(gm, n) for n in calls})
    results = results_of(out)
    if len(results) > 1:
        return NoMatch(
            f"no template writes {len(results)} outputs from one read ({', '.join(ops)}): each template writes one"
        )
    return NoMatch(f"no template matches this graph ({', '.join(ops) or 'no calls'})")


def _rendered(pattern: str, summary: str, spec: OpSpec, params: list, ctx: dict, jinja_name: str = "") -> Match:
    jinja = f"candidates/{jinja_name or pattern}.py.j2"
    tensor_params = [p for p in params if p[1] == "cute.Tensor"]
    ctx = {**ctx, "params": params, "tensor_params": tensor_params, "scalar_params": params[len(tensor_params) :]}
    return Match(pattern, summary, templates.render(jinja, spec=spec, **ctx), jinja, ctx)


def render(spec: OpSpec, match: Match, knobs: str) -> str:
    """`match`'s kernel with other template knobs (e.g. "unroll=8"), as the offline search varies them."""
    if not match.jinja:
        return match.source
    return templates.render(match.jinja, spec=spec, knobs=knobs, **match.context)
