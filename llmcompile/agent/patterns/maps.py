"""map: every node elementwise over full tensors, per-row vectors and runtime scalars."""

from __future__ import annotations

import torch
from torch import fx

from llmcompile.agent.patterns.emit import Emitter
from llmcompile.agent.patterns.graph import BINARY, UNARY, VIEWS, op_of, param_names, results_of, split_nodes
from llmcompile.specs import OpSpec


def match_map(spec: OpSpec, gm: fx.GraphModule, given: list, shapes: dict) -> dict | None:
    ph, calls, (out,) = split_nodes(gm)
    results = results_of(out)
    if not calls or not all(isinstance(r, fx.Node) and r in shapes for r in results):
        return None  # (a graph of no calls returns its input: nothing to write)
    oshape = shapes[results[0]]
    if any(shapes[r] != oshape for r in results) or len(oshape) < 1:
        return None
    kinds_of = {op.kind for op in (op_of(gm, n) for n in calls)}
    if not kinds_of <= (UNARY | BINARY | VIEWS | {"clamp"}):
        return None
    env, tensors, scalars = param_names(spec, given, ph)
    tens = [(n, g) for n, g in zip(ph, given) if isinstance(g, torch.Tensor)]
    kinds = []
    for _node, g in tens:
        if tuple(g.shape) == tuple(oshape):
            kinds.append("full")
        elif g.dim() >= 1 and g.numel() == oshape[0] and len(oshape) >= 2:
            kinds.append("row")  # one value per leading index, broadcast along the rest
        else:
            return None
    # a row operand is only viewed (unsqueezed) before it meets a full one
    for (node, _), kind in zip(tens, kinds):
        if kind == "row" and any(op_of(gm, u).kind in VIEWS and len(u.users) == 0 for u in node.users):
            return None
    em = Emitter(gm, env, vector=True)
    exprs = [em.expr(r) for r in results]
    return {"kinds": kinds, "tensors": tensors, "scalars": scalars, "exprs": exprs, "ops": sorted(kinds_of)}
