"""Idioms written by hand, folded back into a reduction the templates take: the stable softmax's
sum(exp(x - max(x))) is exp(logsumexp(x) - max(x)). As written, the sum reads the max's result (a
second pass over x); folded, the max and the log-sum-exp are one fold (folds.SAME_VALUES)."""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx

_SUMS = {torch.sum, "sum"}
_EXPS = {torch.exp, "exp"}
_SUBS = {operator.sub, torch.sub, "sub"}
_MAXES = {torch.amax: "amax", "amax": "amax", torch.max: "max", "max": "max"}


def _call(n: Any, targets: set | dict) -> bool:
    return isinstance(n, fx.Node) and n.op in ("call_function", "call_method") and n.target in targets


def _reduced(n: fx.Node, rank: int) -> tuple[tuple[int, ...], bool] | None:
    """The dims a reduction call names (normalized, sorted) and its keepdim; None without a dim."""
    dim = n.kwargs.get("dim", n.args[1] if len(n.args) > 1 else None)
    keep = n.kwargs.get("keepdim", n.args[2] if len(n.args) > 2 else False)
    dims = dim if isinstance(dim, (tuple, list)) else (dim,)
    if dim is None or not all(isinstance(d, int) for d in dims) or not isinstance(keep, bool):
        return None
    return tuple(sorted({d % rank for d in dims})), keep


def _max_of(n: Any, rank: int) -> tuple[fx.Node, tuple[int, ...], bool] | None:
    """(x, dims, keepdim) where `n` is x's amax, or max's values ([0]) along a dim."""
    if isinstance(n, fx.Node) and n.op == "call_function" and n.target is operator.getitem and n.args[1] == 0:
        n = n.args[0]
        if not _call(n, _MAXES) or _MAXES[n.target] != "max":
            return None
    elif not _call(n, _MAXES) or _MAXES[n.target] != "amax":
        return None
    red = _reduced(n, rank)
    return None if red is None else (n.args[0], *red)


def fold_idioms(gm: fx.GraphModule) -> bool:
    """Each sum(exp(x - m)) over the dims m = max(x) was kept over (keepdim) replaced by
    exp(logsumexp(x) - amax(x)) over the same dims; returns whether any was. Needs the graph's
    shapes (ShapeProp's tensor_meta), for the dims' rank."""
    changed = False
    for n in list(gm.graph.nodes):
        if not _call(n, _SUMS) or not _call(e := n.args[0], _EXPS) or not _call(d := e.args[0], _SUBS):
            continue
        if set(n.kwargs) - {"dim", "keepdim"} or len(n.args) > 3 or len(e.args) != 1 or len(d.args) != 2 or d.kwargs:
            continue  # (a sum to another dtype, an out=, sub's alpha: not the idiom as written)
        meta = n.args[0].meta.get("tensor_meta")
        red = _reduced(n, len(meta.shape)) if meta is not None else None
        m = _max_of(d.args[1], len(meta.shape)) if red is not None else None
        if m is None or m[0] is not d.args[0] or m[1] != red[0] or not m[2]:
            continue
        x, (dims, keep) = d.args[0], red
        with gm.graph.inserting_before(n):
            lse = gm.graph.call_function(torch.logsumexp, (x,), {"dim": dims, "keepdim": keep})
            top = d.args[1] if keep else gm.graph.call_function(torch.amax, (x,), {"dim": dims, "keepdim": False})
            made = gm.graph.call_function(torch.exp, (gm.graph.call_function(operator.sub, (lse, top)),))
        n.replace_all_uses_with(made)
        gm.graph.erase_node(n)
        changed = True
    if changed:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return changed
