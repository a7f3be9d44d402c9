"""chain: a statistic of each row, then a whole-tensor fold of those values: a regularizer's
`x.norm(dim=-1).mean()`, a z-loss's `torch.logsumexp(x, -1).pow(2).mean()`, a mean distance
`(x - y).pow(2).sum(-1).sqrt().mean()`. The graph is cut at the whole fold's input: the rows'
part is put to the norm matcher, the rest to the whole-tensor one, and the kernel runs the
norm template's rows into the workspace, then the total template over them."""

from __future__ import annotations

import math

import torch
from torch import fx

from llmcompile.agent.patterns.graph import REDUCTIONS, Unsupported, op_of, split_nodes
from llmcompile.agent.patterns.norm import match_norm_of_rows
from llmcompile.agent.patterns.total import match_total, whole_reduction
from llmcompile.specs import OpSpec


def match_rows_then_total(spec: OpSpec, gm: fx.GraphModule, given: list, shapes: dict) -> dict | None:
    ph, calls, _ = split_nodes(gm)
    if not all(isinstance(g, torch.Tensor) for g in given):
        return None
    reds = [op for op in (op_of(gm, n) for n in calls) if op.kind in REDUCTIONS]
    whole = [op for op in reds if whole_reduction(op, shapes)]
    if len(whole) != 1 or len(reds) < 2 or not isinstance(r := whole[0].args[0], fx.Node):
        return None
    upstream = _ancestors(r)
    if any(op.node not in upstream for op in reds if op is not whole[0]):
        return None  # a row statistic read after the fold: not two stages
    if any(n.op == "get_attr" for n in gm.graph.nodes):
        raise Unsupported("a model's parameters beside a statistic of each row folded whole")
    rows_gm, rows_shapes = _cut_before(gm, upstream, r, shapes)
    fold_gm, fold_shapes = _cut_after(gm, upstream, r, shapes)
    if fold_gm is None:
        return None  # the fold's side reads x (or another row stage) beside the rows' values
    rows = match_norm_of_rows(spec, rows_gm, given, rows_shapes)
    if not rows or rows["mode"] != "groups" or rows["apply"] is not None or "written" in rows:
        return None
    values = torch.empty(tuple(shapes[r]), dtype=torch.float32, device="meta")
    fold = match_total(spec, fold_gm, [values], fold_shapes)
    if fold and fold["with_index"]:
        raise Unsupported(f"`{fold['reduction']}` of each row's values (an index across the rows' passes)")
    if not fold or fold["rewrite"]:
        return None
    x = tuple(shapes[ph[0]])
    lead = next(k for k in range(len(x) + 1) if math.prod(x[k:]) == rows["seg_len"])
    return {
        **{f"row_{k}": rows[k] for k in ("prologue", "finalize", "combine", "identity")},
        **{k: rows.get(k, False) for k in ("weighted", "with_index")},
        "param_kinds": rows.get("param_kinds", "()"),
        "seg_len": rows["seg_len"],
        "lead": lead,
        "ins": [t.name for t in spec.tensors[: len(given)]],
        "prologue": fold["prologue"],
        "epilogue": fold["epilogue"],
        "combine": fold["combine"],
        "identity": fold["identity"],
        "what": f"{rows['what']}, then the {fold['reduction']} of those values",
    }


def _ancestors(node: fx.Node) -> set[fx.Node]:
    seen, todo = {node}, [node]
    while todo:
        for a in todo.pop().all_input_nodes:
            if a not in seen:
                seen.add(a)
                todo.append(a)
    return seen


def _cut_before(gm: fx.GraphModule, upstream: set, r: fx.Node, shapes: dict) -> tuple[fx.GraphModule, dict]:
    """The rows' part: every input, and what `r` is made of, with `r` its output."""
    g, env = fx.Graph(), {}
    for n in gm.graph.nodes:
        if n.op == "placeholder" or n in upstream:
            env[n] = g.node_copy(n, env.__getitem__)
    g.output(env[r])
    return fx.GraphModule(gm, g), {env[n]: s for n, s in shapes.items() if n in env}


def _cut_after(gm: fx.GraphModule, upstream: set, r: fx.Node, shapes: dict) -> tuple[fx.GraphModule | None, dict]:
    """The fold's part: `r` its one input, then every node after; None where one of those reads a
    node of the rows' part other than `r`."""
    g = fx.Graph()
    env = {r: g.placeholder("values")}
    for n in gm.graph.nodes:
        if n.op == "placeholder" or n in upstream:
            continue
        if any(a not in env for a in n.all_input_nodes):
            return None, {}
        if n.op == "output":
            g.output(fx.map_arg(n.args[0], env.__getitem__))
        else:
            env[n] = g.node_copy(n, env.__getitem__)
    return fx.GraphModule(gm, g), {env[n]: s for n, s in shapes.items() if n in env}
