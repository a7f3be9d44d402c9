"""folds: a reduction as the templates fold it (the REDUCE kinds: combine, identity, prologue,
statistic), a graph's reductions found, and several of one dim folded together as one tuple.
Shared by the norm, strided, leading and whole-tensor templates."""

from __future__ import annotations

import math
import re
from typing import Any

from torch import fx

from llmcompile.agent.patterns.emit import Emitter, lit
from llmcompile.agent.patterns.graph import (
    NORMALIZERS,
    REDUCTIONS,
    VIEWS,
    Op,
    Unsupported,
    depends_on,
    op_of,
    results_of,
)

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
    # torch.max(x, dim) / torch.min(x, dim) with both its values and its indices: two statistics
    "max_and_index": ("S.argmax", (-math.inf, 0.0), "{x}, Float32(r)", "acc[0], acc[1]"),
    "min_and_index": ("S.argmin", (math.inf, 0.0), "{x}, Float32(r)", "acc[0], acc[1]"),
    "prod": ("S.mul", (1.0,), "{x}", "acc[0]"),
    # (m, s): s * exp(m), a term (x, 1); all -inf gives -inf, as torch's does
    "logsumexp": ("S.max_sumexp", (-math.inf, 0.0), "{x}, Float32(1.0)", "acc[0] + cute.math.log(acc[1])"),
    # (count, mean, squared deviations) merged without cancellation; {inv_rc}: 1 / (R - correction)
    "var": ("S.count_mean_m2", (0.0, 0.0, 0.0), "Float32(1.0), {x}, Float32(0.0)", "acc[2] * {inv_rc}"),
    "std": ("S.count_mean_m2", (0.0, 0.0, 0.0), "Float32(1.0), {x}, Float32(0.0)", "cute.math.sqrt(acc[2] * {inv_rc})"),
}


def correction(op: Op) -> int:
    """What var and std divide by is R less this: torch.var(x, dim, unbiased=True), or correction=."""
    if "correction" in op.kw:
        return int(op.kw["correction"])
    unbiased = op.kw.get("unbiased", op.args[2] if len(op.args) > 2 and isinstance(op.args[2], bool) else True)
    return 1 if unbiased else 0


def inv_dof(op: Op, length: int | str) -> str:
    """1 / (R - correction), what var and std multiply their squared deviations by, as source
    (torch gives nan where R <= correction). `length`: R, or the name R has at run time."""
    if isinstance(length, str):
        return f"(Float32(1.0) / ({length} - Float32({lit(float(correction(op)))})))"
    rc = length - correction(op)
    return lit(1.0 / rc) if rc > 0 else "Float32(math.nan)"


def reduce_dim(op: Op) -> Any:
    """The dim a reduction call names (norm's comes after p); None: the whole tensor."""
    at = 2 if op.kind == "norm" else 1
    dim = op.kw.get("dim", op.args[at] if len(op.args) > at else None)
    if op.kind in ("var", "std") and isinstance(dim, bool):  # torch.var(x, unbiased): no dim
        return None
    return dim


def norm_p(op: Op) -> Any:
    return op.kw.get("p", op.args[1] if len(op.args) > 1 else "fro")


def norm_as_sum(op: Op) -> tuple[str, str, Any]:
    """A norm as a sum: how the prologue wraps an element `{x}`, how the epilogue wraps the
    sum `{s}`, and the norm's p."""
    p = norm_p(op)
    if p in (2, 2.0, "fro"):
        return "({x} * {x})", "cute.math.sqrt({s})", p
    if p in (1, 1.0):
        return "cute.math.abs({x})", "{s}", p
    if isinstance(p, (int, float)) and not isinstance(p, bool) and 0 < p < math.inf:  # (ord=3, ord=0.5)
        a = "cute.math.abs({x})"
        power = (
            " * ".join([a] * int(p)) if float(p).is_integer() and p <= 4 else f"cute.math.pow({a}, Float32({lit(p)}))"
        )
        return f"({power})", f"cute.math.pow({{s}}, Float32({lit(1.0 / p)}))", p
    raise Unsupported(f"norm p={p!r}")


# any, all and count_nonzero read each element as nonzero (1.0) or not (0.0), then fold those
_TRUTH = {"any": "amax", "all": "amin", "count_nonzero": "sum"}


PAIRED = ("max_and_index", "min_and_index")  # reductions with two results a row (values, indices)


def paired_outputs(red: Op, carrier: fx.Node, results: list) -> None:
    """A max or min with its indices is the graph's whole output: the pair returned as it is,
    or its values then its indices."""
    picked = [
        r.args[1] if isinstance(r, fx.Node) and r.op != "output" and r.args[:1] == (carrier,) else None for r in results
    ]
    if results != [carrier] and picked != [0, 1]:
        raise Unsupported(f"`{red.kind.split('_')[0]}` whose values and indices are not the outputs, in that order")


def exact_count(red: Op, n: int) -> None:
    """count_nonzero sums 1.0s in fp32 and argmax carries its index as one: exact to 2^24,
    refused past that (torch's are exact at any size)."""
    if red.kind in ("count_nonzero", "argmax", "argmin", *PAIRED) and n > 1 << 24:
        raise Unsupported(f"`{red.kind}` over {n} elements (an index or a count in fp32, exact to 2^24)")


def as_reduce(red: Op) -> tuple[str, str, str]:
    """A reduction as one of REDUCE's kinds: the kind, how the prologue wraps an element `{x}`,
    how the statistic wraps the result `{s}` (a norm is a sum of |x| or x*x and its root, or for
    p = inf the largest |x|)."""
    if red.kind in _TRUTH:
        return _TRUTH[red.kind], "cutlass.select_({x} != Float32(0.0), Float32(1.0), Float32(0.0))", "{s}"
    if red.kind != "norm":
        return red.kind, "{x}", "{s}"
    if norm_p(red) in (math.inf, "inf"):
        return "amax", "cute.math.abs({x})", "{s}"
    if norm_p(red) in (-math.inf, "-inf"):
        return "amin", "cute.math.abs({x})", "{s}"
    wrap, post, _ = norm_as_sum(red)
    return "sum", wrap, post


def reduction_parts(
    gm: fx.GraphModule, red: Op, xnode: fx.Node, length: int | str, others: dict | None = None
) -> tuple[str, str, str, str]:
    """A reduction over `length` elements of x as a template takes it (or over as many as the
    run-time value `length` names): the combine, its identity (as source), the prologue an
    element goes through, and the statistic made of `acc`. (A norm is a sum of |x| or x*x, and
    its root.) `others`: how the prologue names other inputs (a residual read where x is)."""
    kind, wrap, post = as_reduce(red)
    combine, identity, pro_fmt, epi = REDUCE[kind]
    pro = wrap.format(x=Emitter(gm, {xnode: "x", **(others or {})}, vector=False).expr(red.args[0]))
    inv_rc = inv_dof(red, length) if kind in ("var", "std") else ""
    inv_r = f"(Float32(1.0) / {length})" if isinstance(length, str) else lit(1.0 / length)
    stat = post.format(s=epi.format(inv_r=inv_r, inv_rc=inv_rc))
    return combine, ", ".join(lit(v) for v in identity) + ",", pro_fmt.format(x=pro), stat


JOINT_SLOTS = 3  # values one joint fold carries: the norm template's statistics a row (its MAX_ARITY)


# Reductions of the same values that one fold computes together: the kind whose fold (REDUCE's)
# they share, and the statistics of that fold's `acc` for kinds REDUCE folds another way
SAME_VALUES = (
    ("var", {"sum": "(acc[0] * acc[1])", "mean": "acc[1]"}),  # a Chan merge: (count, mean, m2)
    ("logsumexp", {"amax": "acc[0]", "max": "acc[0]"}),  # the max and its sum of exponentials
)


def joint_fold(
    parts: list[tuple[str, str, str, str]], kinds: list[str], element: str | None = None
) -> tuple[str, str, str, list[str]]:
    """Several reductions over the same elements as one fold of a tuple, from each one's
    `reduction_parts`: the combine, its identity, the prologue, and each one's statistic of `acc`.
    Of the same values (`element`, as the prologue reads them), one fold that yields them all where
    there is one (a mean and a variance: one Chan merge); else each its own fold side by side
    (`S.joint` of each one's combine over its own slots; sums alone add slot by slot)."""
    same = next(
        (j for j in SAME_VALUES if all(k in j[1] or REDUCE.get(k, ("",))[0] == REDUCE[j[0]][0] for k in kinds)), None
    )
    if element is not None and same is not None:
        anchor, other = same
        combine, identity, term, _ = REDUCE[anchor]
        stats = [other.get(k) or st for k, (_, _, _, st) in zip(kinds, parts)]
        return combine, ", ".join(lit(v) for v in identity) + ",", term.format(x=element), stats
    slots = [i.count(",") for _, i, _, _ in parts]
    if sum(slots) > JOINT_SLOTS or any("Float32(r)" in p for _, _, p, _ in parts):
        what = ", ".join(sorted(set(kinds)))
        raise Unsupported(f"{len(parts)} reductions ({what}) in one fold (up to {JOINT_SLOTS} values, no index)")
    offsets = [sum(slots[:k]) for k in range(len(parts))]
    stats = [
        re.sub(r"acc\[(\d)\]", lambda m, o=o: f"acc[{int(m.group(1)) + o}]", st)
        for o, (_, _, _, st) in zip(offsets, parts)
    ]
    combines = [c for c, _, _, _ in parts]
    combine = (
        "S.add" if set(combines) == {"S.add"} else f"S.joint({', '.join(f'({c}, ({i}))' for c, i, _, _ in parts)})"
    )
    return combine, " ".join(i for _, i, _, _ in parts), ", ".join(p for _, _, p, _ in parts), stats


def fold_together(
    gm: fx.GraphModule, ops: list[Op], xnode: fx.Node, length: int | str
) -> tuple[str, str, str, list[str]]:
    """Reductions of x along one dim (over `length` elements) as one fold: `joint_fold` of each
    one's `reduction_parts`, told the element they share where they read the same values."""
    same = len({r.args[0] for r in ops}) == 1
    element = Emitter(gm, {xnode: "x"}, vector=False).expr(ops[0].args[0]) if same else None
    return joint_fold([reduction_parts(gm, r, xnode, length) for r in ops], [r.kind for r in ops], element)


# how x rewritten with its log-sum-exp s[0] reads, for a softmax node
_NORMALIZED = {"softmax": "cute.math.exp(({x}) - s[0])", "log_softmax": "(({x}) - s[0])"}


def is_reduction(gm: fx.GraphModule, n: fx.Node) -> bool:
    return op_of(gm, n).kind in REDUCTIONS | NORMALIZERS


def rewrite_env(gm: fx.GraphModule, xnode: fx.Node, carrier: fx.Node) -> dict[fx.Node, str]:
    """How a rewrite names x and the reduction's result: the statistic s[0], or for a softmax
    node (x's values carried with the statistic) exp(x - s[0]) or x - s[0]."""
    op = op_of(gm, carrier)
    if op.kind not in NORMALIZERS:
        return {xnode: "x", carrier: "s[0]"}
    x = Emitter(gm, {xnode: "x"}, vector=False).expr(op.args[0])
    return {xnode: "x", carrier: _NORMALIZED[op.kind].format(x=x)}


def stat_name(gm: fx.GraphModule, red: Op, carrier: fx.Node) -> str:
    """What a summary calls the reduction: a softmax is one, not the log-sum-exp it reduces by."""
    kind = op_of(gm, carrier).kind
    return kind if kind in NORMALIZERS else red.kind.replace("_and_index", " and its index")


def find_reductions(
    gm: fx.GraphModule, calls: list[fx.Node], shapes: dict, batch: bool = False
) -> list[tuple[Op, fx.Node, int, int]]:
    """The graph's reductions, each as its op, the node carrying its result (a getitem of
    max/min's pair), the first reduced dim of its input, and how many dims from there it
    reduces (several adjacent dims are one run of memory: (1, 2) of (B, C, L) is C * L). A
    softmax or log_softmax is the log-sum-exp of its dim, carried by the softmax node. With
    `batch`, each is over the batch dim and a trailing block (`batch_block`), named by the block."""
    found = [op_of(gm, n) for n in calls]
    return [_reduction(gm, op, shapes, batch) for op in found if op.kind in REDUCTIONS | NORMALIZERS]


def batch_block(r: Op, shapes: dict) -> int | None:
    """The first dim of the trailing block a reduction over the batch dim and that block reduces,
    with at least one dim kept between ((0, 2, 3) of (N, C, H, W): 2; batch statistics); None for
    any other dims."""
    dim = reduce_dim(r)
    if not isinstance(dim, (list, tuple)) or not isinstance(r.args[0], fx.Node) or r.args[0] not in shapes:
        return None
    rank = len(shapes[r.args[0]])
    dims = sorted({d % rank for d in dim})
    if len(dims) < 2 or dims[0] != 0 or dims[1] < 2 or dims[1:] != list(range(dims[1], rank)):
        return None
    return dims[1]


def regrouped(gm: fx.GraphModule, r: Op, shapes: dict) -> None:
    """Refuse a reduction along dims of a view that reshapes the input's elements on the way to
    it (`x.reshape(-1, N)`, `x.unsqueeze(1)`): a template reads the dims as the input's own, so
    dim 2 of `x.unsqueeze(1)` would be x's dim 2. A view of a smaller tensor (a weight's, a
    statistic's) only broadcasts it."""
    size = math.prod(shapes[r.args[0]])
    todo, seen = [r.args[0]], set()
    while todo:
        n = todo.pop()
        if n in seen or n.op not in ("call_function", "call_method"):
            continue
        seen.add(n)
        src = n.args[0] if n.args else None
        if op_of(gm, n).kind in VIEWS and src in shapes and n in shapes and shapes[src] != shapes[n]:
            if math.prod(shapes[src]) == size:
                raise Unsupported(
                    f"`{r.kind}` of a view that regroups its input, {tuple(shapes[src])} as {tuple(shapes[n])}: "
                    "the templates reduce the input's own dims"
                )
        todo.extend(n.all_input_nodes)


def _reduction(gm: fx.GraphModule, r: Op, shapes: dict, batch: bool = False) -> tuple[Op, fx.Node, int, int]:
    dim = reduce_dim(r)
    x = r.args[0]
    rank = len(shapes[x])
    span = 1
    if batch:  # (the batch dim's elements count too: its segments are in the group)
        if (block := batch_block(r, shapes)) is None:
            over = "the whole tensor" if dim is None else dim
            raise Unsupported(f"`{r.kind}` over {over} beside batch statistics (each over the batch and the same dims)")
        exact_count(r, shapes[x][0] * math.prod(shapes[x][block:]))
        regrouped(gm, r, shapes)
        return r, r.node, block, rank - block
    if isinstance(dim, (list, tuple)):
        dims = sorted({d % rank for d in dim})
        if dims != list(range(dims[0], dims[0] + len(dims))):
            raise Unsupported(f"`{r.kind}` over {tuple(dim)}: the templates reduce adjacent dims")
        dim, span = dims[0], len(dims)
    if not isinstance(dim, int):
        raise Unsupported(f"`{r.kind}` over {dim!r}: the templates reduce one dim")
    if span < rank:
        regrouped(gm, r, shapes)
    carrier = r.node
    if r.kind in NORMALIZERS:
        r = Op(r.node, "logsumexp", r.args[:1], {"dim": dim})
    if r.kind in ("max", "min"):
        users = list(r.node.users)
        picks = [u.args[1] for u in users if u.op != "output" and op_of(gm, u).kind == "getitem"]
        if any(not isinstance(i, int) or i not in (0, 1) for i in picks):
            raise Unsupported(f"`{r.kind}`'s values and indices taken by {', '.join(map(repr, picks))}")
        if any(u.op == "output" for u in users) or sorted(picks) == [0, 1]:
            # both the values and the indices: one fold of (value, index) pairs gives the two
            r = Op(r.node, f"{r.kind}_and_index", r.args, r.kw)
            exact_count(r, math.prod(shapes[x][dim % rank : dim % rank + span]))
            return r, r.node, dim % rank, span
        if len(users) != 1 or op_of(gm, users[0]).kind != "getitem":
            raise Unsupported(f"`{r.kind}` whose values and indices are used apart")
        idx = users[0].args[1]
        r = Op(
            r.node,
            {("max", 0): "max", ("min", 0): "min", ("max", 1): "argmax", ("min", 1): "argmin"}[(r.kind, idx)],
            r.args,
            r.kw,
        )
        carrier = users[0]
    exact_count(r, math.prod(shapes[x][dim % rank : dim % rank + span]))
    return r, carrier, dim % rank, span


def joint_outputs(
    gm: fx.GraphModule, inputs: set, reds: list, stats: list[str], out: fx.Node, shapes: dict, where: str
) -> str:
    """The epilogue of several reductions folded together (`joint_fold`: each one's statistic in
    `stats`): the graph's outputs, each made of their results alone and of one shape (a range, a
    nanmean, torch.aminmax's pair). A rewrite of x with several is not taken."""
    carriers = tuple(c for _, c, *_ in reds)
    side = depends_on(gm, inputs, carriers)
    results = results_of(out)
    if any(not isinstance(r, fx.Node) or side.get(r) != {"r"} for r in results):
        raise Unsupported(f"x rewritten with {len(reds)} reductions {where} (one is taken)")
    if len({tuple(shapes.get(r, ())) for r in results}) > 1:
        raise Unsupported(f"{len(results)} outputs of {len(reds)} reductions, of different shapes")
    em = Emitter(gm, {c: f"({st})" for c, st in zip(carriers, stats)}, vector=False)
    return ", ".join(em.expr(r) for r in results)
