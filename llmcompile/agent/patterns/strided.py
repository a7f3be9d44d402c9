"""strided: one reduction along a middle dim, with a prologue, an epilogue and, for a norm, a
rewrite of the input. Its reduction finder is shared by the total and norm families."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import fx

from llmcompile.agent.patterns.emit import Emitter, lit
from llmcompile.agent.patterns.graph import (
    REDUCTIONS,
    Op,
    Unsupported,
    depends_on,
    one_result,
    op_of,
    param_names,
    split_nodes,
)
from llmcompile.specs import OpSpec

REDUCE = {
    # kind: (combine, identity, prologue-wrapper, epilogue given acc and R)
    "sum": ("S.add", (0.0,), "{x}", "acc[0]"),
    "mean": ("S.add", (0.0,), "{x}", "acc[0] * {inv_r}"),
    "amax": ("S.fmax", (-math.inf,), "{x}", "acc[0]"),
    "amin": ("S.fmin", (math.inf,), "{x}", "acc[0]"),
    "max": ("S.fmax", (-math.inf,), "{x}", "acc[0]"),
    "min": ("S.fmin", (math.inf,), "{x}", "acc[0]"),
    "argmax": ("S.argmax", (-math.inf, 0.0), "{x}, Float32(r)", "acc[1]"),
    "argmin": ("S.argmin", (math.inf, 0.0), "{x}, Float32(r)", "acc[1]"),
}


def reduce_dim(op: Op) -> Any:
    """The dim a reduction call names (norm's comes after p); None: the whole tensor."""
    at = 2 if op.kind == "norm" else 1
    return op.kw.get("dim", op.args[at] if len(op.args) > at else None)


def norm_as_sum(op: Op) -> tuple[str, str, Any]:
    """A norm as a sum: how the prologue wraps an element `{x}`, how the epilogue wraps the
    sum `{s}`, and the norm's p."""
    p = op.kw.get("p", op.args[1] if len(op.args) > 1 else "fro")
    if p in (2, 2.0, "fro"):
        return "({x} * {x})", "cute.math.sqrt({s})", p
    if p in (1, 1.0):
        return "cute.math.abs({x})", "{s}", p
    raise Unsupported(f"norm p={p!r}")


def reduction_parts(gm: fx.GraphModule, red: Op, xnode: fx.Node, length: int) -> tuple[str, str, str, str]:
    """A reduction over `length` elements of x as a template takes it: the combine, its identity
    (as source), the prologue an element goes through, and the statistic made of `acc`. (A norm
    is a sum of |x| or x*x, and its root.)"""
    kind, wrap, post = red.kind, "{x}", "{s}"
    if kind == "norm":
        wrap, post, _ = norm_as_sum(red)
        kind = "sum"
    combine, identity, pro_fmt, epi = REDUCE[kind]
    pro = wrap.format(x=Emitter(gm, {xnode: "x"}, vector=False).expr(red.args[0]))
    stat = post.format(s=epi.format(inv_r=lit(1.0 / length)))
    return combine, ", ".join(lit(v) for v in identity) + ",", pro_fmt.format(x=pro), stat


def find_reduction(gm: fx.GraphModule, calls: list[fx.Node], shapes: dict) -> tuple[Op, fx.Node, int]:
    """The graph's one reduction: its op, the node carrying its result (a getitem of
    max/min's pair), and the reduced dim of its input."""
    reds = [op for op in (op_of(gm, n) for n in calls) if op.kind in REDUCTIONS]
    if len(reds) != 1:
        raise Unsupported(f"{len(reds)} reductions (the templates fuse one)")
    r = reds[0]
    dim = reduce_dim(r)
    if isinstance(dim, (list, tuple)) and len(dim) == 1:
        dim = dim[0]
    if not isinstance(dim, int):
        raise Unsupported(f"`{r.kind}` over {dim!r}: the templates reduce one dim")
    x = r.args[0]
    rank = len(shapes[x])
    carrier = r.node
    if r.kind in ("max", "min"):
        users = list(r.node.users)
        if len(users) != 1 or op_of(gm, users[0]).kind != "getitem":
            raise Unsupported(f"`{r.kind}` with values and indices")
        idx = users[0].args[1]
        r = Op(
            r.node,
            {("max", 0): "max", ("min", 0): "min", ("max", 1): "argmax", ("min", 1): "argmin"}[(r.kind, idx)],
            r.args,
            r.kw,
        )
        carrier = users[0]
    return r, carrier, dim % rank


def match_strided(spec: OpSpec, gm: fx.GraphModule, given: list, shapes: dict) -> dict | None:
    ph, calls, (out,) = split_nodes(gm)
    tens = [(n, g) for n, g in zip(ph, given) if isinstance(g, torch.Tensor)]
    if len(tens) != 1 or not any(op_of(gm, n).kind in REDUCTIONS for n in calls):
        return None
    xnode = tens[0][0]
    red, carrier, dim = find_reduction(gm, calls, shapes)
    rank = len(shapes[xnode])
    if dim == 0:
        raise Unsupported("a reduction over the batch dim")
    if dim == rank - 1:
        return None  # the norm template's (a rewrite with a row statistic), else nobody's
    r_len = shapes[xnode][dim]
    env, _, _ = param_names(spec, given, ph)
    side = depends_on(gm, {xnode}, carrier)
    res = one_result(out, "strided")
    combine, identity, prologue, epi = reduction_parts(gm, red, xnode, r_len)
    if side.get(res) == {"r"}:  # a reduction: the output is a function of its result
        epilogue, rewrite = Emitter(gm, {carrier: epi}, vector=False).expr(res), None
    elif side.get(res) == {"x", "r"}:  # a norm: the input rewritten with the statistic
        epilogue = epi
        rewrite = Emitter(gm, {xnode: "x", carrier: "s[0]"}, vector=False).expr(res)
    else:
        return None
    return {
        "dim": dim,
        "r": r_len,
        "combine": combine,
        "identity": identity,
        "prologue": prologue,
        "epilogue": epilogue,
        "rewrite": rewrite,
        "reduction": red.kind,
        "x": env[xnode],
    }
