"""softmax / log_softmax along the last dim: the reference kernels themselves, on the input as
rows (its leading dims together)."""

from __future__ import annotations

import math

from torch import fx

from llmcompile.agent.patterns.graph import op_of, results_of, split_nodes, under_views
from llmcompile.specs import OpSpec


def match_rowop(spec: OpSpec, gm: fx.GraphModule, given: list, shapes: dict) -> dict | None:
    """The op and the rows: a 2-D input is the reference kernel's own contract; a longer one is
    viewed as rows by prompts/candidates/rows.py.j2."""
    ph, calls, (out,) = split_nodes(gm)
    results = results_of(out)
    if len(results) != 1 or len(given) != 1 or not isinstance(node := results[0], fx.Node):
        return None
    node, views = under_views(gm, node)  # (returned reshaped: the same memory, so the same kernel)
    if calls != [node, *reversed(views)]:
        return None
    op = op_of(gm, node)
    if op.kind not in ("softmax", "log_softmax") or op.kw.get("dtype"):
        return None
    dim = op.kw.get("dim", op.args[1] if len(op.args) > 1 else None)
    shape = tuple(shapes[ph[0]])
    rank = len(shape)
    if rank < 2 or not isinstance(dim, int) or dim % rank != rank - 1 or not given[0].is_floating_point():
        return None
    rows_per_item = math.prod(shape[1:-1])
    return {"op": op.kind, "rank": rank, "n": shape[-1], "rows_per_item": rows_per_item, "reshaped": bool(views)}
