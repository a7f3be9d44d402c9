"""softmax / log_softmax along the last dim of a 2-D input: the reference kernels themselves."""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from llmcompile.agent.patterns.graph import op_of, results_of, split_nodes
from llmcompile.specs import OpSpec


def is_len_minus_one(gm: fx.GraphModule, node: Any) -> bool:
    """`x.size(d) - 1`, as traced."""
    if not isinstance(node, fx.Node) or node.op == "placeholder" or op_of(gm, node).kind != "sub":
        return False
    size, one = node.args[:2]
    return one == 1 and isinstance(size, fx.Node) and size.op == "call_method" and size.target == "size"


def match_rowop(spec: OpSpec, gm: fx.GraphModule, given: list, shapes: dict) -> str | None:
    ph, calls, (out,) = split_nodes(gm)
    if len(calls) != 1 or len(given) != 1:
        return None
    op = op_of(gm, calls[0])
    if op.kind not in ("softmax", "log_softmax") or results_of(out) != [calls[0]]:
        return None
    dim = op.kw.get("dim", op.args[1] if len(op.args) > 1 else None)
    rank = len(shapes[ph[0]])
    if rank != 2 or not isinstance(dim, int) or dim % rank != 1 or given[0].dtype != torch.float32:
        return None
    return op.kind
