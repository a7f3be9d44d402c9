"""strided: one reduction along a middle dim (or several folded together), with a prologue, an
epilogue and, for a norm, a rewrite of the input; along the first dims, the leading template's."""

from __future__ import annotations

import math

import torch
from torch import fx

from llmcompile.agent.patterns.emit import Emitter
from llmcompile.agent.patterns.folds import (
    PAIRED,
    find_reductions,
    fold_together,
    is_reduction,
    joint_outputs,
    paired_outputs,
    reduction_parts,
    rewrite_env,
    stat_name,
)
from llmcompile.agent.patterns.graph import (
    Op,
    Unsupported,
    depends_on,
    one_result,
    param_names,
    results_of,
    split_nodes,
)
from llmcompile.specs import OpSpec
from llmcompile.specs.contract import MAX_WORKSPACE

LEADING_STATS = 4  # a column's statistics in the leading-dim template's workspace (its MAX_ARITY)


def match_strided(spec: OpSpec, gm: fx.GraphModule, given: list, shapes: dict) -> dict | None:
    ph, calls, (out,) = split_nodes(gm)
    tens = [(n, g) for n, g in zip(ph, given) if isinstance(g, torch.Tensor)]
    if len(tens) != 1 or not any(is_reduction(gm, n) for n in calls):
        return None
    xnode = tens[0][0]
    reds = find_reductions(gm, calls, shapes)
    red, carrier, dim, span = reds[0]
    if len({(d, sp) for _, _, d, sp in reds}) > 1:
        raise Unsupported(f"{len(reds)} reductions along different dims (a template folds one dim)")
    shape = tuple(shapes[xnode])
    rank = len(shape)
    lead = dim == 0  # the leading-dim template's: R is the batch size, known at run time
    if lead and span == rank:
        raise Unsupported(f"`{red.kind}` over every dim by name (the whole-tensor template takes it with no dim)")
    if dim + span == rank and not lead:
        return None  # the norm template's (a rewrite with a row statistic), else nobody's
    if span > 1 and not lead:
        raise Unsupported(f"`{red.kind}` over dims {dim}-{dim + span - 1} of {rank}: one middle dim, or trailing dims")
    r_len = math.prod(shape[dim : dim + span])
    env, _, _ = param_names(spec, given, ph)
    length = "r" if lead else r_len
    n_stats = 1
    if len(reds) > 1:  # several folded together (a nanmean's sum and count): the outputs made of them
        ops = [r for r, *_ in reds]
        combine, identity, prologue, stats = fold_together(gm, ops, xnode, length)
        red, rewrite = Op(carrier, " and ".join(r.kind for r in ops), red.args), None
        if (joint := _joint_rewrite(gm, xnode, reds, out, shapes)) is not None:  # x standardized along a dim
            epilogue, rewrite, n_stats = ", ".join(stats), joint, len(stats)
        else:
            epilogue = joint_outputs(gm, {xnode}, reds, stats, out, shapes, "along a dim other than the last")
    else:
        combine, identity, prologue, epi = reduction_parts(gm, red, xnode, length)
        side = depends_on(gm, {xnode}, carrier)
        if red.kind in PAIRED:  # the values and their indices: output i is the epilogue's value i
            paired_outputs(red, carrier, results_of(out))
            epilogue, rewrite = epi, None
        elif side.get(res := one_result(out, "strided")) == {"r"}:  # the output is a function of the result
            epilogue, rewrite = Emitter(gm, {carrier: epi}, vector=False).expr(res), None
        elif side.get(res) == {"x", "r"}:  # a norm: the input rewritten with the statistic
            epilogue = epi
            rewrite = Emitter(gm, rewrite_env(gm, xnode, carrier), vector=False).expr(res)
        else:
            return None
    inner, arity = math.prod(shape[dim + span :]), identity.count(",")
    if lead and inner * (LEADING_STATS + arity) > MAX_WORKSPACE:
        raise Unsupported(f"`{red.kind}` over the batch dim of {inner} columns (their partials pass the workspace)")
    return {
        "lead": lead,
        "span": span,
        "workspace": f"L.workspace_elems({inner}, {arity})",
        "dim": dim,
        "r": r_len,
        "combine": combine,
        "identity": identity,
        "prologue": prologue,
        "epilogue": epilogue,
        "rewrite": rewrite,
        "stats": n_stats,
        "reduction": stat_name(gm, red, carrier),
        "x": env[xnode],
    }


def _joint_rewrite(gm: fx.GraphModule, xnode: fx.Node, reds: list, out: fx.Node, shapes: dict) -> str | None:
    """The one output as x rewritten with several statistics of its dim ((x - mean) / std, a min-max
    scaling), reading statistic i as s[i]; None where the output is not such a rewrite."""
    carriers = tuple(c for _, c, *_ in reds)
    results = results_of(out)
    side = depends_on(gm, {xnode}, carriers)
    if len(results) != 1 or side.get(results[0]) != {"x", "r"}:
        return None
    if any(side.get(c) != {"r"} for c in carriers):
        raise Unsupported(f"x rewritten with {len(reds)} reductions along a dim other than the last, one a softmax")
    if tuple(shapes.get(results[0], ())) != tuple(shapes[xnode]):
        raise Unsupported(f"an output of shape {tuple(shapes.get(results[0], ()))} made of x {tuple(shapes[xnode])}")
    return Emitter(gm, {xnode: "x", **{c: f"s[{i}]" for i, c in enumerate(carriers)}}, vector=False).expr(results[0])
