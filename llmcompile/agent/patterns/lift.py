"""A view that merges runs of its input's dims (`x.view(-1, N)`, `x.flatten(0, 1)`,
`x.reshape(B * S, H)`), read in the input's own dims.

Each dim of such a view is a run of adjacent dims of x, in order. What the graph then computes on
the view, elementwise and along whole dims of it, it computes on x along those runs: a reduction
over a view dim is one over its run (`x.view(-1, N).sum(-1)` is x.sum(-1)), a softmax along a view
dim that is one dim of x is a softmax along that dim, and an operand that broadcasts against the
view broadcasts against x where the dims it spans are x's own. The templates reduce x's own dims
(`folds.regrouped` refuses a view that regroups them); lifted so, the graph is one they take, with
its result reshaped to the view's shape only where it leaves the computation. A view's layout is
x's memory, so the kernel is the one written for x and writes the same bytes.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from llmcompile.agent.patterns.graph import (
    BINARY,
    CASTS,
    COMPARISONS,
    NORMALIZERS,
    REDUCTIONS,
    SCANS,
    UNARY,
    kind_of,
)

Runs = tuple[tuple[int, int], ...]  # each view dim's run of x's dims, [start, end)

_ELEMENTWISE = UNARY | BINARY | CASTS | frozenset(COMPARISONS) | {"clamp", "isnan", "where"}
# along one dim only (an index along it, a running fold): the view dim must be one dim of x
_ONE_DIM = frozenset({"max", "min", "argmax", "argmin", "prod", "any", "all"}) | NORMALIZERS | SCANS


def runs_of(xs: tuple[int, ...], vs: tuple[int, ...]) -> Runs | None:
    """Each dim of shape `vs` as a run of adjacent dims of `xs` whose sizes multiply to it; None
    where `vs` splits a dim of `xs` (x dims of size 1 join the run after them, trailing
    ones the last)."""
    runs, i = [], 0
    for s in vs:
        j, size = i, 1
        while j < len(xs) and (size < s or j == i):
            size *= xs[j]
            j += 1
        if size != s:
            return None
        runs.append((i, j))
        i = j
    if not runs or any(xs[k] != 1 for k in range(i, len(xs))):
        return None
    runs[-1] = (runs[-1][0], len(xs))
    return tuple(runs)


def lift_views(gm: fx.GraphModule) -> bool:
    """Each merging view whose computation along its dims maps onto x's dims, lifted (module
    docstring); returns whether any was. Needs the graph's shapes (ShapeProp's tensor_meta)."""
    changed = False
    for v in list(gm.graph.nodes):
        if kind_of(gm, v) not in ("view", "reshape", "flatten") or not isinstance(x := v.args[0], fx.Node):
            continue
        xs, vs = _shape(x), _shape(v)
        runs = runs_of(xs, vs) if xs is not None and vs is not None else None
        if runs is None or all(b - a == 1 for a, b in runs):
            continue
        region = _region(gm, v, Lifted(runs, xs))
        if any(kind_of(gm, n) in _ALONG for n in region) and _leaves_as_tensors(region):
            _rewrite(gm, v, x, region)
            changed = True
    if changed:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return changed


_ALONG = REDUCTIONS | NORMALIZERS | SCANS


@dataclass(frozen=True)
class Lifted:
    """A node read in x's dims: each of its (view) dims' run of its own dims, and its shape so."""

    runs: Runs
    shape: tuple[int, ...]


def _shape(n: Any) -> tuple[int, ...] | None:
    meta = n.meta.get("tensor_meta") if isinstance(n, fx.Node) else None
    return tuple(meta.shape) if hasattr(meta, "shape") else None


def _region(gm: fx.GraphModule, v: fx.Node, at_v: Lifted) -> dict[fx.Node, Lifted]:
    """The nodes computed from view `v` that read the same in x's dims; any other reader of them
    is where the computation leaves the view (and reads it reshaped)."""
    region = {v: at_v}
    after = False
    for n in gm.graph.nodes:
        if n is v:
            after = True
        elif after and any(a in region for a in n.all_input_nodes):
            got = _lifted(gm, n, region)
            if got is not None:
                region[n] = got
    return region


def _leaves_as_tensors(region: dict[fx.Node, Lifted]) -> bool:
    """Every node read outside the region is a tensor (not max's pair of values and indices)."""
    return all(_shape(n) is not None for n in region if any(u not in region for u in n.users))


def _lifted(gm: fx.GraphModule, n: fx.Node, region: dict[fx.Node, Lifted]) -> Lifted | None:
    """Node n read in x's dims, or None where it does not read the same so."""
    kind = kind_of(gm, n)
    if n.op == "call_function" and n.target is operator.getitem:  # (max's values or indices; not x[i])
        pair = n.args[0] in region and _shape(n.args[0]) is None
        return region[n.args[0]] if pair and isinstance(n.args[1], int) else None
    if kind in _ELEMENTWISE:
        return _broadcast(n, region)
    if kind not in _ALONG or not n.args or n.args[0] not in region or any(a in region for a in n.all_input_nodes[1:]):
        return None
    src = region[n.args[0]]
    slot = _dim_slot(n)
    dim = _dim_value(gm, n, slot)
    dims = _dims_named(dim, len(src.runs))
    whole = kind in REDUCTIONS and dim in (None, ())  # (a flat index is the view's and x's alike)
    if dims is None or (kind in _ONE_DIM and not whole and any(b - a != 1 for a, b in (src.runs[d] for d in dims))):
        return None
    if kind not in REDUCTIONS:
        return src
    gone = {k for d in dims for k in range(*src.runs[d])}
    if _keepdim(n, slot):
        return Lifted(src.runs, tuple(1 if k in gone else s for k, s in enumerate(src.shape)))
    kept = [src.runs[d] for d in range(len(src.runs)) if d not in dims]
    runs, at = [], 0
    for a, b in kept:
        runs.append((at, at + b - a))
        at += b - a
    return Lifted(tuple(runs), tuple(s for k, s in enumerate(src.shape) if k not in gone))


def _broadcast(n: fx.Node, region: dict[fx.Node, Lifted]) -> Lifted | None:
    """An elementwise node read in x's dims: its widest operand from the view sets its runs;
    every other operand spans only view dims that are one dim of x each, or comes from the
    view with runs of the same lengths."""
    out = _shape(n)
    ours = [a for a in n.all_input_nodes if a in region]
    if out is None or not ours:
        return None
    runs = max((region[a] for a in ours), key=lambda got: len(got.runs)).runs
    if len(runs) != len(out):
        return None
    lengths, shapes = [b - a for a, b in runs], []
    for a in n.all_input_nodes:
        if a in region:
            theirs, shape = [b - c for c, b in region[a].runs], region[a].shape
        elif (shape := _shape(a)) is not None:
            while shape and shape[0] == 1:  # (leading 1s broadcast against any dims)
                shape = shape[1:]
            theirs = [1] * len(shape)
        else:
            return None
        if len(theirs) > len(lengths) or (theirs and lengths[-len(theirs) :] != theirs):
            return None
        shapes.append(shape)
    return Lifted(runs, tuple(torch.broadcast_shapes(*shapes)))


def _dim_slot(n: fx.Node) -> tuple[str, Any]:
    """Where node n names its dims: ("kw", "dim"), ("arg", i) or ("module", None)."""
    if n.op == "call_module":
        return "module", None
    if "dim" in n.kwargs:
        return "kw", "dim"
    return "arg", 2 if n.target in _P_FIRST else 1


_P_FIRST = (torch.norm, torch.linalg.vector_norm, "norm")  # (a norm's dim comes after its p)


def _dim_value(gm: fx.GraphModule, n: fx.Node, slot: tuple[str, Any]) -> Any:
    where, key = slot
    if where == "module":
        return gm.get_submodule(str(n.target)).dim
    if where == "kw":
        return n.kwargs[key]
    return n.args[key] if len(n.args) > key else None


def _dims_named(dim: Any, rank: int) -> tuple[int, ...] | None:
    """The view dims a dim argument names, sorted (all of them for none); None where it is not
    a dim or a list of dims."""
    if dim is None or dim == ():
        return tuple(range(rank))
    dims = dim if isinstance(dim, (tuple, list)) else (dim,)
    if not all(isinstance(d, int) and not isinstance(d, bool) and -rank <= d < rank for d in dims):
        return None
    return tuple(sorted({d % rank for d in dims}))


def _keepdim(n: fx.Node, slot: tuple[str, Any]) -> bool:
    at = (slot[1] if slot[0] == "arg" else 2 if n.target in _P_FIRST else 1) + 1
    if len(n.args) > at and isinstance(n.args[at], bool) and n.target in _UNBIASED_FIRST:
        at += 1  # (torch.var(x, dim, unbiased, keepdim))
    return n.kwargs.get("keepdim", n.args[at] if len(n.args) > at else False) is True


_UNBIASED_FIRST = (torch.var, torch.std, "var", "std")


def _rewrite(gm: fx.GraphModule, v: fx.Node, x: fx.Node, region: dict[fx.Node, Lifted]) -> None:
    """The region computed from x itself, along each view dim's run; each reader outside it
    reads the result reshaped to the shape it had."""
    plan = [
        (n, region[n.args[0]].runs if n.args and n.args[0] in region else (), [u for u in n.users if u not in region])
        for n in region
        if n is not v
    ]
    for n, runs, outside in plan:
        shape = _shape(n)
        n.args = fx.node.map_arg(n.args, lambda a: x if a is v else a)
        n.kwargs = fx.node.map_arg(n.kwargs, lambda a: x if a is v else a)
        made = _along_runs(gm, n, runs) if kind_of(gm, n) in _ALONG else n
        if outside and shape != region[n].shape:
            with gm.graph.inserting_after(made):
                back = gm.graph.call_method("reshape", (made, shape))
            for u in outside:
                u.replace_input_with(made, back)


def _along_runs(gm: fx.GraphModule, n: fx.Node, runs: Runs) -> fx.Node:
    """Node n along the x dims of the view dims it named; a module made the function it calls
    (returned: the node that now stands for n)."""
    slot = _dim_slot(n)
    dim = _dim_value(gm, n, slot)
    if dim is None or dim == ():
        return n  # (the whole tensor, as it was)
    dims = _dims_named(dim, len(runs))
    assert dims is not None  # (_lifted read them)
    xdims = tuple(k for d in dims for k in range(*runs[d]))
    new: Any = xdims[0] if len(xdims) == 1 and not isinstance(dim, (tuple, list)) else xdims
    if n.target in (torch.norm, "norm") and len(xdims) > 2 and _norm_p(n) == "fro":
        # (torch's Frobenius norm over more than two dims is its matrix norm's error; its value is the 2-norm's)
        n.args, n.kwargs = (
            (n.args[:1] + (2.0,) + n.args[2:], n.kwargs) if len(n.args) > 1 else (n.args, {**n.kwargs, "p": 2.0})
        )
    where, key = slot
    if where == "kw":
        n.kwargs = {**n.kwargs, "dim": new}
    elif where == "arg":
        n.args = (*n.args[:key], new, *n.args[key + 1 :])
    else:
        fn = torch.softmax if kind_of(gm, n) == "softmax" else torch.log_softmax
        with gm.graph.inserting_after(n):
            made = gm.graph.call_function(fn, (n.args[0],), {"dim": new})
        n.replace_all_uses_with(made)
        return made
    return n


def _norm_p(n: fx.Node) -> Any:
    return n.kwargs.get("p", n.args[1] if len(n.args) > 1 else "fro")
