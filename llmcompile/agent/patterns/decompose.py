"""torch's shorthands for reductions the templates take written out: before matching, each call is
rewritten into the graph torch defines it as, the graph a user writes by hand (F.rms_norm is
x * rsqrt(mean(x^2) + eps) * w), so it gets the kernel that written-out form gets."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn


class Refused(ValueError):
    """A shorthand called with what its written-out form cannot say (the matcher names it)."""


def _trailing(shape: Any) -> int | tuple[int, ...]:
    if isinstance(shape, fx.Node):
        raise Refused("a norm over a shape computed in the model (write it as a tuple)")
    k = len(shape) if isinstance(shape, (tuple, list, torch.Size)) else 1
    return -1 if k == 1 else tuple(range(-k, 0))


def _rms_norm(g: fx.Graph, x: Any, normalized_shape: Any, weight: Any = None, eps: Any = None) -> fx.Node:
    if eps is None:  # (torch takes the dtype's machine epsilon: the written-out form needs a number)
        raise Refused("`rms_norm` without eps (pass eps)")
    ms = g.call_function(
        torch.mean, (g.call_function(torch.pow, (x, 2)),), {"dim": _trailing(normalized_shape), "keepdim": True}
    )
    y = g.call_function(operator.mul, (x, g.call_function(torch.rsqrt, (g.call_function(operator.add, (ms, eps)),))))
    return y if weight is None else g.call_function(operator.mul, (y, weight))


def _layer_norm(
    g: fx.Graph, x: Any, normalized_shape: Any, weight: Any = None, bias: Any = None, eps: Any = 1e-5, *_: Any
) -> fx.Node:
    dims = {"dim": _trailing(normalized_shape), "keepdim": True}
    mean = g.call_function(torch.mean, (x,), dims)
    var = g.call_function(torch.var, (x,), {**dims, "correction": 0})
    rstd = g.call_function(torch.rsqrt, (g.call_function(operator.add, (var, eps)),))
    y = g.call_function(operator.mul, (g.call_function(operator.sub, (x, mean)), rstd))
    y = y if weight is None else g.call_function(operator.mul, (y, weight))
    return y if bias is None else g.call_function(operator.add, (y, bias))


def _normalize(g: fx.Graph, x: Any, p: Any = 2.0, dim: Any = 1, eps: Any = 1e-12, out: Any = None) -> fx.Node:
    if out is not None:
        raise Refused("`normalize` into out=")
    norm = g.call_function(torch.norm, (x, p, dim), {"keepdim": True})
    return g.call_function(operator.truediv, (x, g.call_function(torch.clamp_min, (norm, eps))))


def _softmin(g: fx.Graph, x: Any, dim: Any = None, _stacklevel: int = 3, dtype: Any = None) -> fx.Node:
    if dim is None or dtype is not None:
        raise Refused("`softmin` without a dim, or with a dtype")
    return g.call_function(torch.softmax, (g.call_function(operator.neg, (x,)), dim))


def _logsumexp(g: fx.Graph, x: Any, dim: Any, keepdim: Any = False) -> fx.Node:
    return g.call_function(torch.logsumexp, (x, dim), {"keepdim": keepdim})


def _linalg_norm(g: fx.Graph, x: Any, ord: Any = None, dim: Any = None, keepdim: Any = False, **_: Any) -> fx.Node:
    # a vector norm over one dim; over two, or all of a matrix, only ord None or "fro" (Frobenius) is one
    if (isinstance(dim, int) and ord == "fro") or (not isinstance(dim, int) and ord not in (None, "fro")):
        raise Refused(f"`linalg.norm` with ord={ord!r} over dim={dim!r} (a matrix norm, or none)")
    ord = 2 if ord in (None, "fro") else ord
    return g.call_function(torch.linalg.vector_norm, (x,), {"ord": ord, "dim": dim, "keepdim": keepdim})


def _square(g: fx.Graph, x: Any) -> fx.Node:
    return g.call_function(torch.pow, (x, 2))


def _nan_reduction(mean: bool) -> Callable[..., fx.Node]:
    """torch.nansum / nanmean: NaNs left out of the sum (and of the count a mean divides by)."""

    def rule(g: fx.Graph, x: Any, dim: Any = None, keepdim: Any = False, *, dtype: Any = None) -> fx.Node:
        if dtype is not None:
            raise Refused(f"`{'nanmean' if mean else 'nansum'}` with a dtype")
        nan = g.call_function(torch.isnan, (x,))
        dims = {"dim": dim, "keepdim": keepdim}
        total = g.call_function(torch.sum, (g.call_function(torch.where, (nan, 0.0, x)),), dims)
        if not mean:
            return total
        kept = g.call_function(torch.sum, (g.call_function(torch.where, (nan, 0.0, 1.0)),), dims)
        return g.call_function(operator.truediv, (total, kept))

    return rule


def _spread_and_mean(spread: Callable) -> Callable[..., tuple[fx.Node, fx.Node]]:
    """torch.var_mean / std_mean: (var or std, mean), two nodes (`decompose` hands each on); without
    a dim, of the whole tensor (`var_mean(x, False)`: the bool is `unbiased`)."""

    def rule(g: fx.Graph, x: Any, dim: Any = None, unbiased: Any = None, keepdim: Any = False, **kw: Any) -> tuple:
        if set(kw) - {"correction", "keepdim"}:
            raise Refused(f"`{spread.__name__}_mean` with {sorted(set(kw) - {'correction', 'keepdim'})}")
        if isinstance(dim, bool):
            dim, unbiased = None, dim
        keep = kw.get("keepdim", keepdim)
        c = kw.get("correction", 1 if unbiased is None or unbiased else 0)
        return (
            g.call_function(spread, (x, dim), {"correction": c, "keepdim": keep}),
            g.call_function(torch.mean, (x, dim), {"keepdim": keep}),
        )

    return rule


def _aminmax(g: fx.Graph, x: Any, *, dim: Any = None, keepdim: Any = False) -> tuple[fx.Node, fx.Node]:
    """torch.aminmax: (amin, amax) of the same elements, two nodes (one fold takes both)."""
    dims = {} if dim is None else {"dim": dim, "keepdim": keepdim}
    return g.call_function(torch.amin, (x,), dims), g.call_function(torch.amax, (x,), dims)


def _unsqueezes(index: Any) -> list[int] | None:
    """Where `t[index]` inserts dims, as the unsqueeze positions that make the same view one after
    another (from the left before an Ellipsis, from the right after it), where the index only
    inserts dims (None among full slices and one Ellipsis: t[:, None], t[..., None], t[None]);
    else None."""
    items = index if isinstance(index, tuple) else (index,)
    full = slice(None, None, None)
    if not any(i is None for i in items) or any(i is not None and i is not Ellipsis and i != full for i in items):
        return None
    if sum(i is Ellipsis for i in items) > 1:
        return None
    cut = items.index(Ellipsis) if Ellipsis in items else len(items)
    at, left = [], 0
    for i in items[:cut]:
        if i is None:
            at.append(left)
        left += 1
    right = 0
    for i in reversed(items[cut + 1 :]):
        if i is None:
            at.append(-right - 1)
        right += 1
    return at


def _index_view(g: fx.Graph, x: Any, index: Any) -> fx.Node:
    """t[:, None] (an index that only inserts dims) as the unsqueezes it is."""
    for at in _unsqueezes(index) or []:
        x = g.call_method("unsqueeze", (x, at))
    return x


_FUNCTIONS: dict[Any, Callable[..., fx.Node]] = {
    F.rms_norm: _rms_norm,
    F.layer_norm: _layer_norm,
    torch.layer_norm: _layer_norm,
    F.normalize: _normalize,
    F.softmin: _softmin,
    torch.special.logsumexp: _logsumexp,
    torch.linalg.norm: _linalg_norm,
    torch.square: _square,
    torch.nansum: _nan_reduction(mean=False),
    torch.nanmean: _nan_reduction(mean=True),
    torch.var_mean: _spread_and_mean(torch.var),
    torch.std_mean: _spread_and_mean(torch.std),
    torch.aminmax: _aminmax,
}
_METHODS: dict[str, Callable[..., fx.Node]] = {
    "square": _square,
    "nansum": _nan_reduction(mean=False),
    "nanmean": _nan_reduction(mean=True),
    "aminmax": _aminmax,
}
_FIELDS = {"values": 0, "indices": 1, "min": 0, "max": 1}  # (max/min's, aminmax's)


def _field(g: fx.Graph, result: Any, name: str) -> fx.Node:
    """A max's, min's or aminmax's result read by name, as by position: `.values` is [0]."""
    return g.call_function(operator.getitem, (result, _FIELDS[name]))


def _module_rule(gm: fx.GraphModule, n: fx.Node) -> Callable[..., fx.Node] | None:
    mod = gm.get_submodule(str(n.target))

    def param(name: str) -> Callable[[fx.Graph], fx.Node | None]:
        return (
            (lambda g: g.get_attr(f"{n.target}.{name}")) if getattr(mod, name, None) is not None else (lambda g: None)
        )

    if isinstance(mod, nn.RMSNorm):
        return lambda g, x: _rms_norm(g, x, mod.normalized_shape, param("weight")(g), mod.eps)
    # a LayerNorm called alone is the norm modules' own match (patterns/norm.py); among other
    # calls (on x + a residual, or cast around it) it is written out like F.layer_norm
    if isinstance(mod, nn.LayerNorm) and any(
        c is not n and c.op in ("call_function", "call_method", "call_module") for c in gm.graph.nodes
    ):
        return lambda g, x: _layer_norm(g, x, mod.normalized_shape, param("weight")(g), param("bias")(g), mod.eps)
    if isinstance(mod, nn.Softmin):
        return lambda g, x: _softmin(g, x, mod.dim)
    if isinstance(mod, nn.CrossEntropyLoss):
        return lambda g, x, target: _cross_entropy_module(g, x, target, mod)
    return None


def _cross_entropy_module(g: fx.Graph, x: Any, target: Any, mod: nn.CrossEntropyLoss) -> fx.Node:
    """`nn.CrossEntropyLoss()(x, t)`: F.cross_entropy with the module's options (the cross-entropy
    match names any it does not take)."""
    if mod.weight is not None:
        raise Refused("`CrossEntropyLoss` with class weights")
    kw = {"ignore_index": mod.ignore_index, "reduction": mod.reduction}
    if mod.label_smoothing:
        kw["label_smoothing"] = mod.label_smoothing
    return g.call_function(F.cross_entropy, (x, target), kw)


def _rule(gm: fx.GraphModule, n: fx.Node) -> Callable[..., fx.Node] | None:
    if n.op == "call_function":
        if n.target is operator.getitem and _unsqueezes(n.args[1]) is not None:
            return _index_view
        return _field if n.target is getattr and n.args[1] in _FIELDS else _FUNCTIONS.get(n.target)
    if n.op == "call_method":
        return _METHODS.get(str(n.target))
    return _module_rule(gm, n) if n.op == "call_module" else None


def _hand_on(n: fx.Node, parts: tuple[fx.Node, ...]) -> list[fx.Node]:
    """A call of several results written out as `parts`: each `n[i]` (or `n.max`, a field by
    name) becomes part i, and n returned whole, the parts. Returns the reads it erased."""
    erased = []
    for u in list(n.users):
        by_index = u.op == "call_function" and u.target is operator.getitem and isinstance(u.args[1], int)
        if by_index or (u.op == "call_function" and u.target is getattr and u.args[1] in _FIELDS):
            u.replace_all_uses_with(parts[u.args[1] if by_index else _FIELDS[u.args[1]]])
            u.graph.erase_node(u)
            erased.append(u)
        elif u.op == "output":
            u.args = fx.node.map_arg(u.args, lambda a: parts if a is n else a)
        else:
            raise Refused(f"`{n.target.__name__}`'s results used whole, not one by one")
    return erased


def decompose(gm: fx.GraphModule) -> None:
    """Each shorthand call in `gm` replaced by its written-out graph (raises `Refused`)."""
    g, changed, gone = gm.graph, False, set()
    for n in list(g.nodes):
        rule = None if n in gone else _rule(gm, n)  # (a read of a result a rule before handed on)
        if rule is None:
            continue
        with g.inserting_before(n):
            made = rule(g, *n.args, **n.kwargs)
        if isinstance(made, tuple):
            gone.update(_hand_on(n, made))
        else:
            n.replace_all_uses_with(made)
        g.erase_node(n)
        changed = True
    if changed:
        g.eliminate_dead_code()  # (what only the shorthand read: a shape, say)
        gm.recompile()
