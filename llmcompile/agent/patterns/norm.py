"""norm: statistics of groups, then every element rewritten with them (BatchNorm, InstanceNorm,
GroupNorm, LayerNorm over trailing dims, x with a statistic of its last dim); a matrix-vector
product as a value a group."""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import torch
from torch import fx, nn

from llmcompile.agent.patterns.emit import Emitter, lit
from llmcompile.agent.patterns.folds import (
    PAIRED,
    batch_block,
    find_reductions,
    fold_together,
    is_reduction,
    paired_outputs,
    reduction_parts,
    rewrite_env,
    stat_name,
)
from llmcompile.agent.patterns.graph import (
    VIEWS,
    Op,
    Unsupported,
    depends_on,
    only_module,
    op_of,
    param_names,
    results_of,
    split_nodes,
)
from llmcompile.specs import OpSpec

_NORM_MODULES = (
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.InstanceNorm1d,
    nn.InstanceNorm2d,
    nn.InstanceNorm3d,
    nn.GroupNorm,
    nn.LayerNorm,
)


def match_norm_module(spec: OpSpec, gm: fx.GraphModule, given: list, shapes: dict) -> dict | None:
    """A BatchNorm / InstanceNorm / GroupNorm / LayerNorm module applied to the one input:
    its groups and its affine parameters' indexing (see reference_kernels/norm.py)."""
    only = only_module(gm, 1)
    if only is None or not isinstance(only[1], _NORM_MODULES):
        return None
    ph, mod = only
    shape = tuple(shapes[ph[0]])
    rank = len(shape)
    name = type(mod).__name__
    if isinstance(mod, nn.LayerNorm):
        k = len(mod.normalized_shape)
        if tuple(shape[rank - k :]) != tuple(mod.normalized_shape) or k >= rank:
            raise Unsupported(f"`{name}` over {tuple(mod.normalized_shape)} of an input {shape}")
        mode, gpi, seg = "groups", math.prod(shape[1 : rank - k]), math.prod(shape[rank - k :])
        mul, div = 0, 1  # a weight per normalized element
        what = f"LayerNorm over the last {k} dims ({seg} elements a group)"
    else:
        if rank < 2 or shape[1] != getattr(mod, "num_features", getattr(mod, "num_channels", None)):
            raise Unsupported(f"`{name}` of an input {shape}")
        # BatchNorm and InstanceNorm: the kernel is passed no running statistics to use
        if isinstance(mod, nn.modules.batchnorm._NormBase) and not mod.training and mod.track_running_stats:
            raise Unsupported(f"`{name}` in eval mode (running statistics)")
        c, spatial = shape[1], math.prod(shape[2:])
        if isinstance(mod, nn.GroupNorm):
            g = mod.num_groups
            mode, gpi, seg, mul, div = "groups", g, c // g * spatial, c // g, spatial
            what = f"GroupNorm, {g} groups of {c // g} channels x {spatial}"
        elif isinstance(mod, nn.modules.batchnorm._BatchNorm):
            mode, gpi, seg, mul, div = "segments", c, spatial, 1, spatial
            what = f"BatchNorm with batch statistics, a channel over the batch x {spatial}"
        else:
            mode, gpi, seg, mul, div = "groups", c, spatial, 1, spatial
            what = f"InstanceNorm over {spatial} elements a channel"
    params = [t.name for t in spec.tensors if not t.output][1:]
    affine = [n for n, p in mod.named_parameters() if p is not None]
    if len(params) != len(affine) or affine not in ([], ["weight"], ["weight", "bias"]):
        raise Unsupported(f"`{name}` with parameters {affine}")
    apply = "(x - s[0]) * s[1]" + " * p[0]" * (len(affine) >= 1) + " + p[1]" * (len(affine) == 2)
    return {
        "what": what,
        "moments": True,
        "eps": lit(float(mod.eps)),
        "combine": "S.add",
        "identity": "0.0, 0.0,",
        "apply": apply,
        "mode": mode,
        "groups_per_item": gpi,
        "seg_len": seg,
        "param_mul": mul,
        "param_div": div,
        "norm_params": params,
        "x": spec.tensors[0].name,
    }


_MATMULS = (torch.matmul, torch.mm, torch.mv, operator.matmul)


def match_gemv(spec: OpSpec, gm: fx.GraphModule, given: list, shapes: dict) -> dict | None:
    """A matrix times a vector, (M, K) @ (K, 1) or (K,): each row folded with the vector."""
    ph, calls, (out,) = split_nodes(gm)
    if len(calls) != 1 or calls[0].op != "call_function" or calls[0].target not in _MATMULS or len(ph) != 2:
        return None
    if list(calls[0].args[:2]) != ph or results_of(out) != [calls[0]]:
        return None
    a, b = (tuple(shapes[n]) for n in ph)
    if len(a) != 2 or b not in ((a[1], 1), (a[1],)):
        raise Unsupported(f"`matmul` of {a} by {b} (the template takes a matrix times a vector)")
    return {
        "what": f"a matrix-vector product, rows of {a[1]} folded with the vector",
        "moments": False,
        "weighted": True,
        "prologue": "x * p[0]",
        "finalize": "acc[0]",
        "combine": "S.add",
        "identity": "0.0,",
        "apply": None,
        "mode": "groups",
        "groups_per_item": 1,
        "seg_len": a[1],
        "param_mul": 0,
        "param_div": 1,
        "norm_params": [spec.tensors[1].name],
        "x": spec.tensors[0].name,
    }


@dataclass(frozen=True)
class Groups:
    """How x (of `shape`) falls into the template's groups, a segment being the dims from `dim`:
    a group a row (mode "groups"), or with `batch` a channel over the batch (mode "segments":
    batch statistics, whose count grows with the batch). The rest follows from these."""

    shape: tuple
    dim: int
    batch: bool = False

    @property
    def mode(self) -> str:
        return "segments" if self.batch else "groups"

    @property
    def per_item(self) -> int:
        return math.prod(self.shape[1 : self.dim])

    @property
    def seg(self) -> int:
        return math.prod(self.shape[self.dim :])

    @property
    def values(self) -> int:
        """The values one statistic a group makes over x."""
        return self.per_item if self.batch else math.prod(self.shape) // self.seg

    @property
    def length(self) -> int | str:
        """What a fold's statistic divides by: the segment, or the template's run-time `count`."""
        return "count" if self.batch else self.seg

    @property
    def noun(self) -> str:
        return "channel" if self.batch else "row"

    @property
    def each(self) -> str:
        return f"a channel over the batch x {self.seg}" if self.batch else f"{self.seg} elements a row"

    @property
    def param_index(self) -> tuple[int, int]:
        """The template's param_mul and param_div: one value an element of a row, or one a channel."""
        return (1, self.seg) if self.batch else (0, 1)

    def takes(self, gm: fx.GraphModule, n: fx.Node, shapes: dict) -> bool:
        """Whether a model's parameter `n` is one value an element of a row; for batch statistics,
        one a channel wherever the graph reads it (through views: w[None, :, None, None])."""
        if not self.batch:
            return tuple(shapes.get(n, ())) == self.shape[self.dim :]
        lead, rank = self.shape[1 : self.dim], len(self.shape)
        for e in _view_ends(gm, n):
            got = tuple(shapes.get(e, ()))
            got = (1,) * (rank - len(got)) + got
            if len(got) != rank or got[1 : self.dim] != lead or any(d != 1 for d in got[:1] + got[self.dim :]):
                return False
        return True


def _view_ends(gm: fx.GraphModule, n: fx.Node) -> list[fx.Node]:
    """The nodes a value reaches through views alone: what the graph's other calls read it as."""
    ends, todo = [], [n]
    while todo:
        v = todo.pop()
        views = [u for u in v.users if _is_view(gm, u)]
        todo += views
        if len(views) < len(v.users):
            ends.append(v)
    return ends


def _is_view(gm: fx.GraphModule, u: fx.Node) -> bool:
    try:
        return u.op in ("call_method", "call_function") and op_of(gm, u).kind in VIEWS
    except Unsupported:  # (a call no template knows: not a view, and the matcher names it)
        return False


def match_norm_of_rows(spec: OpSpec, gm: fx.GraphModule, given: list, shapes: dict) -> dict | None:
    """A statistic of x's last dim (or its trailing dims together), groups of a row: x rewritten
    with it (x / mean(|x|), x / ||x||), or the statistic itself, a value a row (a sum, a mean, a
    max, a norm, a variance, a log-sum-exp of each row, and what the output makes of it alone)."""
    return _norm_of_groups(spec, gm, given, shapes, batch=False)


def match_batch_statistics(spec: OpSpec, gm: fx.GraphModule, given: list, shapes: dict) -> dict | None:
    """The same over the batch dim and the trailing dims together, a group a channel (batch
    statistics: x.mean((0, 2, 3)), torch.var_mean(x, (0, 2)), a BatchNorm written out)."""
    return _norm_of_groups(spec, gm, given, shapes, batch=True)


def _norm_of_groups(spec: OpSpec, gm: fx.GraphModule, given: list, shapes: dict, batch: bool) -> dict | None:
    ph, calls, (out,) = split_nodes(gm)
    tens = [(n, g) for n, g in zip(ph, given) if isinstance(g, torch.Tensor)]
    if not tens or len(tens) != len(given) or not any(is_reduction(gm, n) for n in calls):
        return None
    xnode = tens[0][0]
    shape = tuple(shapes[xnode])
    # other inputs of x's shape, read where x is (a residual added before the norm)
    others = [n for n, _ in tens[1:]]
    if any(tuple(shapes[n]) != shape for n in others):
        return None
    if batch != any(batch_block(op_of(gm, n), shapes) is not None for n in calls if is_reduction(gm, n)):
        return None  # (batch statistics are this matcher's, and only they)
    reds = find_reductions(gm, calls, shapes, batch)
    red, carrier, dim, span = reds[0]
    if dim + span != len(shape) or dim == 0 or len(shape) < 2:
        return None  # (several along another dim: the strided or leading template's, if anyone's)
    grp = Groups(shape, dim, batch)
    if batch and (others or red.kind in PAIRED or red.kind in ("argmax", "argmin")):
        beside = " beside other inputs" if others else ""
        raise Unsupported(f"batch statistics with `{red.kind}`{beside} (values of the batch alone are taken)")
    if others and (red.kind in PAIRED or len(reds) > 1):
        raise Unsupported(f"{len(tens)} inputs beside `{red.kind}` (one reduction of several inputs is taken)")
    results = results_of(out)
    if red.kind in PAIRED:
        return _values_and_indices(spec, gm, shapes, red, carrier, results, xnode, grp)
    if len(reds) > 1:
        return _joint_of_rows(spec, gm, shapes, reds, xnode, results, grp)
    side = depends_on(gm, {xnode, *others}, carrier)
    if _all_values(shapes, side, results, grp.values) and not others:
        combine, identity, prologue, stat = reduction_parts(gm, red, xnode, grp.length)
        parts = {"prologue": prologue, "combine": combine, "identity": identity}
        return _values_of_rows(spec, gm, parts, {carrier: stat}, [red], results, grp)
    elements, values, written = _outputs(spec, shapes, side, xnode, results, grp.values)
    res = elements[0]
    weights = _weights(gm, shapes, grp)
    if others and weights:
        raise Unsupported(f"{len(tens)} inputs and a model's parameters beside a reduction of each row")
    penv = {n: f"p[{i}]" for i, n in enumerate(others)}
    penv.update(_as_stored(gm, spec, results, elements, {xnode: "x", **weights, **penv}))
    combine, identity, prologue, stat = reduction_parts(gm, red, xnode, grp.length, penv)
    env = {**rewrite_env(gm, xnode, carrier), **weights, **penv}  # (what a rewrite reads)
    if values or len(elements) > 1:  # x rewritten (several ways), values of its rows beside it
        if red.kind in ("argmax", "argmin") or stat_name(gm, red, carrier) != red.kind:  # (an index, a softmax)
            raise Unsupported(f"`{stat_name(gm, red, carrier)}` with several outputs beside it")
        rewrites = "x rewritten" if len(elements) == 1 else f"{len(elements)} rewrites of x"
        a = f"a {grp.noun}"
        beside = {0: "", 1: f", and a value {a} beside it"}.get(len(values), f", and {len(values)} values {a}")
        what = f"{rewrites} with its {grp.noun}s' {red.kind}{beside} ({grp.each})"
        parts = {
            "prologue": prologue,
            "finalize": stat,
            "combine": combine,
            "identity": identity,
            "apply": ", ".join(Emitter(gm, env, vector=False).expr(e) for e in elements),
            "per_group": ", ".join(Emitter(gm, {carrier: "s[0]"}, vector=False).expr(v) for v in values),
            "element_outputs": len(elements),
        }
        ctx = {**_rows_context(spec, what, parts, weights, grp, False), "written": written}
        return {**ctx, **_full_inputs(spec, given, ph, others)}
    if side.get(res) == {"x", "r"}:  # x rewritten with its rows' statistic
        what = f"x rewritten with its {grp.noun}s' {stat_name(gm, red, carrier)} ({grp.each})"
        finalize, apply = stat, Emitter(gm, env, vector=False).expr(res)
    elif side.get(res) == {"r"}:  # a value a row: what the output makes of the statistic
        what = f"the {red.kind} of each {grp.noun} ({grp.each})"
        finalize, apply = Emitter(gm, {carrier: f"({stat})"}, vector=False).expr(res), None
    else:
        raise Unsupported("a reduction along the last dim whose output is neither x rewritten nor its statistic")
    parts = {"prologue": prologue, "finalize": finalize, "combine": combine, "identity": identity, "apply": apply}
    ctx = _rows_context(spec, what, parts, weights, grp, red.kind in ("argmax", "argmin"))
    return {**ctx, **_full_inputs(spec, given, ph, others)} if others else ctx


def _full_inputs(spec: OpSpec, given: list, ph: list, others: list) -> dict:
    """Inputs of x's shape beside it, read where x is: the template's "full" parameters, which
    reach the prologue (`weighted`) and the rewrite as p[i]."""
    if not others:
        return {}
    env, _, _ = param_names(spec, given, ph)
    return {"weighted": True, "param_kinds": repr(("full",) * len(others)), "norm_params": [env[n] for n in others]}


def _values_and_indices(
    spec: OpSpec,
    gm: fx.GraphModule,
    shapes: dict,
    red: Op,
    carrier: fx.Node,
    results: list,
    xnode: fx.Node,
    grp: Groups,
) -> dict:
    """torch.max(x, dim=-1) (or min) returned whole: each row's value and its index, both from
    one fold of (value, index) pairs, written to the two outputs."""
    paired_outputs(red, carrier, results)
    if _weights(gm, shapes, grp):
        raise Unsupported(f"`{red.kind.split('_')[0]}` with values and indices beside a model's parameters")
    combine, identity, prologue, stat = reduction_parts(gm, red, xnode, grp.length)
    parts = {"prologue": prologue, "finalize": stat, "combine": combine, "identity": identity, "apply": None}
    what = f"the {red.kind.split('_')[0]} of each row and its index ({grp.each})"
    return {**_rows_context(spec, what, parts, {}, grp, True), "written": [t.name for t in spec.outputs]}


def _all_values(shapes: dict, side: dict, results: list, rows: int) -> bool:
    """Several outputs, each a value a row made of the reductions' results alone (a row's var and
    mean, torch.var_mean's): the fold's finalize writes them all, no rewrite of x."""
    return 1 < len(results) <= STATS and all(
        isinstance(r, fx.Node) and side.get(r) == {"r"} and math.prod(shapes.get(r, (-1,))) == rows for r in results
    )


def _values_of_rows(
    spec: OpSpec,
    gm: fx.GraphModule,
    parts: dict,
    stats: dict,
    ops: list,
    results: list,
    grp: Groups,
) -> dict:
    """`_all_values`' kernel: the fold's finalize writes each output from the statistics (`stats`:
    each reduction's carrier node and its statistic of `acc`), x is not rewritten."""
    finalize = ", ".join(Emitter(gm, {c: f"({st})" for c, st in stats.items()}, vector=False).expr(r) for r in results)
    what = f"{len(results)} values of each {grp.noun} from its {' and '.join(r.kind for r in ops)} ({grp.each})"
    with_index = len(ops) == 1 and ops[0].kind in ("argmax", "argmin")
    ctx = _rows_context(spec, what, {**parts, "finalize": finalize, "apply": None}, {}, grp, with_index)
    return {**ctx, "written": [t.name for t in spec.outputs]}


def _outputs(
    spec: OpSpec, shapes: dict, side: dict, xnode: fx.Node, results: list, rows: int
) -> tuple[list[fx.Node], list[fx.Node], list[str]]:
    """The graph's outputs as the template writes them: x rewritten (several ways: a residual
    sum and its rows normalized), then values of its rows beside a rewrite (the normalized rows
    and their statistic); with the outputs' names in that order. One output is a rewrite or a
    value a row, as the caller decides. `side`: depends_on's of the graph; `rows`: the values one
    statistic a row makes."""
    names = [t.name for t in spec.outputs]
    if len(results) == 1:
        return [results[0]], [], names
    shape = tuple(shapes[xnode])
    rewrite = [
        i for i, r in enumerate(results) if side.get(r) in ({"x", "r"}, {"x"}) and tuple(shapes.get(r, ())) == shape
    ]
    values = [i for i, r in enumerate(results) if side.get(r) == {"r"} and math.prod(shapes.get(r, (-1,))) == rows]
    if len(names) != len(results) or not rewrite or len(rewrite) + len(values) != len(results):
        listed = ", ".join(r.name if isinstance(r, fx.Node) else repr(r) for r in results)
        raise Unsupported(
            f"a graph with {len(results)} outputs ({listed}) that are not x rewritten and values of its rows"
        )
    return [results[i] for i in rewrite], [results[i] for i in values], [names[i] for i in rewrite + values]


# how a 16-bit value rounds where it is stored, read back as fp32
_STORED = {"bfloat16": "Float32(cutlass.BFloat16({e}))", "float16": "Float32(cutlass.Float16({e}))"}


def _as_stored(
    gm: fx.GraphModule, spec: OpSpec, results: list, elements: list[fx.Node], env: dict
) -> dict[fx.Node, str]:
    """Rewrites of x that are outputs, as the rest of the graph reads them: rounded to their
    output's dtype. torch stores `x + y` before it takes the norm of it (the next layer reads
    the residual stream as stored); a norm of the unrounded sum differs by more than a 16-bit
    tolerance where one element dominates its row."""
    dtypes = [t.dtype for t in spec.outputs]
    stored = {}
    for e in elements:
        fmt = _STORED.get(dtypes[results.index(e)])
        if fmt is not None and e not in env and any(u.op != "output" for u in e.users):
            stored[e] = fmt.format(e=Emitter(gm, dict(env), vector=False).expr(e))
    return stored


def _weights(gm: fx.GraphModule, shapes: dict, grp: Groups) -> dict[fx.Node, str]:
    """A model's parameters a rewrite reads, one value an element of a row (an affine weight, a
    bias) or for batch statistics one a channel (`Groups.takes`), as the template names them."""
    weights = {}
    for n in (n for n in gm.graph.nodes if n.op == "get_attr"):
        if not grp.takes(gm, n, shapes):
            where = "batch statistics, not one a channel" if grp.batch else f"rows of {grp.shape[grp.dim :]}"
            raise Unsupported(f"a parameter `{n.target}` of shape {tuple(shapes.get(n, ()))} beside {where}")
        weights[n] = f"p[{len(weights)}]"
    return weights


def _rows_context(spec: OpSpec, what: str, parts: dict, weights: dict, grp: Groups, with_index: bool) -> dict:
    return {
        "what": what,
        "moments": False,
        "with_index": with_index,  # the prologue's (x, r): r the index in the row
        **parts,
        "mode": grp.mode,
        "groups_per_item": grp.per_item,
        "seg_len": grp.seg,
        "param_mul": grp.param_index[0],
        "param_div": grp.param_index[1],
        "norm_params": [str(n.target).replace(".", "_") for n in weights],
        "x": spec.tensors[0].name,
    }


STATS = 3  # statistics a group holds (reference_kernels/norm.py's MAX_ARITY)


def _joint_of_rows(
    spec: OpSpec, gm: fx.GraphModule, shapes: dict, reds: list, xnode: fx.Node, results: list, grp: Groups
) -> dict:
    """Several statistics of each row folded together: of the same values (a mean and a standard
    deviation: a LayerNorm written out), or each its own fold side by side (`joint_fold`); x
    rewritten with them, or what the output makes of them."""
    ops = [r for r, _, _, _ in reds]
    if len({(d, sp) for _, _, d, sp in reds}) != 1 or len(ops) > STATS:
        raise Unsupported(f"{len(ops)} reductions ({', '.join(sorted({r.kind for r in ops}))}) of different dims")
    combine, identity, prologue, stats = fold_together(gm, ops, xnode, grp.length)
    parts = {"prologue": prologue, "combine": combine, "identity": identity}
    carriers = tuple(c for _, c, _, _ in reds)
    sides = depends_on(gm, {xnode}, carriers)
    if _all_values(shapes, sides, results, grp.values):
        return _values_of_rows(spec, gm, parts, dict(zip(carriers, stats)), ops, results, grp)
    elements, values, written = _outputs(spec, shapes, sides, xnode, results, grp.values)
    if len(elements) > 1:
        raise Unsupported(f"{len(elements)} rewrites of x beside {len(ops)} statistics of its rows")
    res = elements[0]
    side = sides.get(res)
    weights = _weights(gm, shapes, grp)
    if side == {"x", "r"}:
        env = {xnode: "x", **{c: f"s[{i}]" for i, c in enumerate(carriers)}, **weights}
        finalize, apply = ", ".join(stats), Emitter(gm, env, vector=False).expr(res)
        stat_env = Emitter(gm, {c: f"s[{i}]" for i, c in enumerate(carriers)}, vector=False)
        per_group = ", ".join(stat_env.expr(v) for v in values)
        what = f"x rewritten with its {grp.noun}s' {' and '.join(r.kind for r in ops)} ({grp.each})"
        if values:
            what += f", and {len(values)} value{'s' * (len(values) > 1)} a {grp.noun} beside it"
    elif side == {"r"}:
        finalize = Emitter(gm, {c: f"({st})" for c, st in zip(carriers, stats)}, vector=False).expr(res)
        apply, what = None, f"what the {' and '.join(r.kind for r in ops)} of each {grp.noun} make ({grp.each})"
    else:
        raise Unsupported("reductions along the last dim whose output is neither x rewritten nor their statistics")
    parts.update(finalize=finalize, apply=apply)
    if values:
        return {
            **_rows_context(spec, what, {**parts, "per_group": per_group}, weights, grp, False),
            "written": written,
        }
    return _rows_context(spec, what, parts, weights, grp, False)
