"""total: a whole tensor folded to a value (losses, a Frobenius norm and its rewrite), and the
reduced losses whose rows come first (cross-entropy, a triplet margin loss)."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from llmcompile.agent.patterns.emit import Emitter, lit
from llmcompile.agent.patterns.folds import (
    REDUCE,
    as_reduce,
    exact_count,
    inv_dof,
    joint_fold,
    joint_outputs,
    norm_p,
    reduce_dim,
)
from llmcompile.agent.patterns.graph import (
    LOSSES,
    REDUCTIONS,
    VIEWS,
    Op,
    Unsupported,
    depends_on,
    one_result,
    only_module,
    op_of,
    param_names,
    results_of,
    split_nodes,
)
from llmcompile.specs import OpSpec


def _loss_term(op: Op, em: Emitter) -> tuple[str, str]:
    """A loss function's elementwise term (in torch's formula) and its reduction."""
    a, b = (em.expr(x) for x in op.args[:2])
    red = op.kw.get("reduction", "mean")
    if op.kw.get("size_average") is not None or op.kw.get("reduce") is not None:
        raise Unsupported(f"`{op.kind}` with the deprecated size_average/reduce")
    if op.kind == "mse_loss":
        term = f"(({a} - {b}) * ({a} - {b}))"
    elif op.kind == "l1_loss":
        term = f"cute.math.abs({a} - {b})"
    elif op.kind == "smooth_l1_loss":
        beta = float(op.kw.get("beta", 1.0))
        d = f"cute.math.abs({a} - {b})"
        if beta == 0.0:
            term = d
        else:
            term = f"cutlass.select_({d} < {lit(beta)}, 0.5 * {d} * {d} / {lit(beta)}, {d} - {lit(0.5 * beta)})"
    else:  # kl_div(input, target): target * (log(target) - input), 0 where target is 0 (xlogy)
        if op.kw.get("log_target", False):
            term = f"cute.math.exp({b}) * ({b} - {a})"
        else:
            term = f"cutlass.select_({b} > 0.0, {b} * (cute.math.log({b}) - {a}), Float32(0.0))"
    if red not in ("mean", "sum", "batchmean") or (red == "batchmean" and op.kind != "kl_div"):
        raise Unsupported(f"`{op.kind}` with reduction={red!r}")
    return term, {"mean": "acc[0] / count", "sum": "acc[0]", "batchmean": "acc[0] / rows"}[red]


def whole_reduction(red: Op, shapes: dict) -> bool:
    """Whether a reduction takes the whole tensor: no dim named, or every dim."""
    dim = reduce_dim(red)
    rank = len(shapes[red.args[0]])
    return dim is None or (isinstance(dim, (list, tuple)) and sorted({d % rank for d in dim}) == list(range(rank)))


def _fold(red: Op, em: Emitter) -> tuple[str, str, str, str, str]:
    """A whole-tensor reduction or reduced loss as the template folds it: the combine, its
    identity (as source), the prologue of an element, the epilogue of `acc`, and its name."""
    if red.kind in LOSSES:
        pro, epi = _loss_term(red, em)
        return "S.add", "0.0,", pro, epi, red.kind
    kind, wrap, post = as_reduce(red)
    what = f"norm (p={norm_p(red)})" if red.kind == "norm" else red.kind
    # the strided reductions' combines; a mean divides by the elements of this call's tensor, a
    # variance by them less its correction
    combine, identity, pro_fmt, epi = REDUCE[kind]
    if kind == "prod":  # scaled, so that no partial product leaves fp32's range (reduce.PROD_SCALE)
        combine, identity, pro_fmt, epi = "S.scaled_mul", (1.0, 0.0), "*S.prod_term({x})", "S.unscaled(acc[0], acc[1])"
    if kind == "mean":
        epi = "acc[0] / count"
    epi = post.format(s=epi.format(inv_rc=inv_dof(red, "count")) if kind in ("var", "std") else epi)
    pro = pro_fmt.format(x=wrap.format(x=em.expr(red.args[0])))
    return combine, ", ".join(lit(v) for v in identity) + ",", pro, epi, what


def match_total(spec: OpSpec, gm: fx.GraphModule, given: list, shapes: dict) -> dict | None:
    ph, calls, (out,) = split_nodes(gm)
    ops = [op_of(gm, n) for n in calls]
    reds = [op for op in ops if op.kind in REDUCTIONS | LOSSES]
    if not reds or any(r.kind in REDUCTIONS and not whole_reduction(r, shapes) for r in reds):
        return None  # along a dim: another template's
    red = reds[0]
    tens = [(n, g) for n, g in zip(ph, given) if isinstance(g, torch.Tensor)]
    full = tuple(shapes[red.args[0]])
    if any(tuple(shapes[r.args[0]]) != full for r in reds):
        raise Unsupported(f"{len(reds)} reductions of tensors of different shapes")
    for r in reds:
        exact_count(r, math.prod(full))
    kinds = []
    for _, g in tens:
        if tuple(g.shape) == full:
            kinds.append("full")
        elif g.dim() == 1 and len(full) >= 1 and g.shape[0] == full[-1]:
            kinds.append("col")  # broadcast along the last dim
        else:
            raise Unsupported(f"an input of shape {tuple(g.shape)} beside a reduction of {full}")
    if not kinds or kinds[0] != "full":
        raise Unsupported("a whole-tensor reduction whose first input is broadcast")
    with_index = red.kind in ("argmax", "argmin")  # the flat index of the first extreme element
    if with_index and len(reds) > 1:
        raise Unsupported(f"`{red.kind}` of the whole tensor beside {len(reds) - 1} other reductions")
    env, tensors, scalars = param_names(spec, given, ph)
    em = Emitter(gm, dict(env), vector=False)
    folds = [_fold(r, em) for r in reds]
    rewrite = None
    if len(reds) > 1:  # several folded together (a nanmean's sum and count): the outputs made of them
        element = em.expr(red.args[0]) if len({r.args[0] for r in reds}) == 1 else None
        combine, identity, pro, stats = joint_fold([f[:4] for f in folds], [r.kind for r in reds], element)
        epi = joint_outputs(
            gm, {n for n, _ in tens}, [(r, r.node) for r in reds], stats, out, shapes, "of the whole tensor"
        )
        what = " and ".join(f[4] for f in folds)
    else:
        ((combine, identity, pro, epi, what),) = folds
        side = depends_on(gm, {n for n, _ in tens}, red.node)
        if side.get(res := one_result(out, "total")) == {"r"}:
            epi = Emitter(gm, {red.node: epi}, vector=False).expr(res)
        elif side.get(res) == {"x", "r"} and len(tens) == 1:
            rewrite = Emitter(gm, {tens[0][0]: "x", red.node: "s[0]"}, vector=False).expr(res)
        else:
            return None
    return {
        "prologue": pro,
        "epilogue": epi,
        "rewrite": rewrite,
        "combine": combine,
        "identity": identity,
        "kinds_repr": repr(tuple(kinds)),
        "tensors": tensors,
        "scalars": scalars,
        "reduction": what,
        "with_index": with_index,
    }


def match_cross_entropy(spec: OpSpec, gm: fx.GraphModule, given: list, shapes: dict) -> dict | None:
    """`F.cross_entropy(logits (M, C), targets (M,))` reduced to a mean or a sum: the rows'
    losses from the cross-entropy reference kernel, then a whole-tensor fold of them. Logits of
    (B, S, C) and targets of (B, S) flattened to those rows (`logits.view(-1, C)`,
    `targets.view(-1)`, as a language model's loss is written) are the same rows."""
    ph, calls, (out,) = split_nodes(gm)
    ce = [n for n in calls if n.target is F.cross_entropy]
    if len(ce) != 1 or results_of(out) != ce or len(ph) != 2:
        return None
    node = ce[0]
    flat = [_flattened(gm, a, shapes) for a in node.args[:2]]
    if flat != ph or len(calls) != 1 + sum(a is not p for a, p in zip(node.args[:2], ph)):
        return None
    x, t = (tuple(shapes[n]) for n in ph)
    kw = dict(node.kwargs)
    extra = {k: v for k, v in kw.items() if k not in ("reduction", "ignore_index")}
    if len(node.args) > 2 or any(v not in (None, 0.0) for v in extra.values()):
        raise Unsupported(f"`cross_entropy` with {sorted(extra) or 'positional options'}")
    red = kw.get("reduction", "mean")
    rows = tuple(shapes[node.args[0]])
    if len(rows) != 2 or t != x[:-1] or given[1].dtype != torch.int64 or red not in ("mean", "sum"):
        raise Unsupported(f"`cross_entropy` of {x} and {t} with reduction={red!r}")
    return {
        "what": f"cross-entropy over {x[-1]} classes, the {red} over rows",
        "ignore_index": int(kw.get("ignore_index", -100)),
        "epilogue": "acc[0] / acc[1]" if red == "mean" else "acc[0]",
        "x": spec.tensors[0].name,
        "target": spec.tensors[1].name,
        "rank": len(x),
    }


def _flattened(gm: fx.GraphModule, a: Any, shapes: dict) -> Any:
    """The input `a` reads, where `a` is it or a view of it that merges its leading dims into
    one (`.view(-1, C)`, `.reshape(-1)`, `.flatten(0, -2)`): the same rows in the same memory."""
    if not isinstance(a, fx.Node) or a.op not in ("call_function", "call_method") or op_of(gm, a).kind not in VIEWS:
        return a
    src, to = a.args[0], tuple(shapes.get(a, ()))
    if not isinstance(src, fx.Node) or src.op != "placeholder" or len(a.users) != 1 or not to:
        return a
    whole = tuple(shapes[src])
    keeps_last = len(to) == 2 and whole[-1:] == to[-1:] and math.prod(whole[:-1]) == to[0]
    return src if keeps_last or to == (math.prod(whole),) else a


def match_triplet(spec: OpSpec, gm: fx.GraphModule, given: list, shapes: dict) -> dict | None:
    """`nn.TripletMarginLoss` (p = 2) of three (M, D) inputs: each row's loss from its two
    distances, then their mean or sum."""
    only = only_module(gm, 3)
    if only is None or not isinstance(only[1], nn.TripletMarginLoss):
        return None
    ph, mod = only
    shape = tuple(shapes[ph[0]])
    if len(shape) != 2 or any(tuple(shapes[n]) != shape for n in ph) or spec.scalars:
        raise Unsupported(f"`TripletMarginLoss` of inputs {[tuple(shapes[n]) for n in ph]}")
    if float(mod.p) != 2.0 or mod.swap or mod.reduction not in ("mean", "sum"):
        raise Unsupported(f"`TripletMarginLoss` with p={mod.p}, swap={mod.swap}, reduction={mod.reduction!r}")
    return {
        "what": f"triplet margin loss over rows of {shape[1]}, the {mod.reduction} over rows",
        "margin": lit(float(mod.margin)),
        "eps": lit(float(mod.eps)),
        "dim": shape[1],
        "epilogue": "acc[0] / count" if mod.reduction == "mean" else "acc[0]",
        "ins": [t.name for t in spec.tensors[:3]],
    }
