"""norm: statistics of groups, then every element rewritten with them (BatchNorm, InstanceNorm,
GroupNorm, LayerNorm over trailing dims, x with a statistic of its last dim); a matrix-vector
product as a value a group."""

from __future__ import annotations

import math
import operator

import torch
from torch import fx, nn

from llmcompile.agent.patterns.emit import Emitter, lit
from llmcompile.agent.patterns.graph import (
    Unsupported,
    depends_on,
    one_result,
    only_module,
    results_of,
    split_nodes,
)
from llmcompile.agent.patterns.strided import (
    find_reduction,
    is_reduction,
    reduction_parts,
    rewrite_env,
    stat_name,
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


def match_norm_of_rows(spec: OpSpec, gm: fx.GraphModule, given: list, shapes: dict) -> dict | None:
    """A statistic of x's last dim (or its trailing dims together), groups of a row: x rewritten
    with it (x / mean(|x|), x / ||x||), or the statistic itself, a value a row (a sum, a mean, a
    max, a norm, a variance, a log-sum-exp of each row, and what the output makes of it alone)."""
    ph, calls, (out,) = split_nodes(gm)
    tens = [(n, g) for n, g in zip(ph, given) if isinstance(g, torch.Tensor)]
    if len(tens) != 1 or len(given) != 1 or not any(is_reduction(gm, n) for n in calls):
        return None
    xnode = tens[0][0]
    red, carrier, dim, span = find_reduction(gm, calls, shapes)
    shape = tuple(shapes[xnode])
    if dim + span != len(shape) or dim == 0 or len(shape) < 2:
        return None
    side = depends_on(gm, {xnode}, carrier)
    res = one_result(out, "norm")
    seg = math.prod(shape[dim:])  # (trailing dims reduced together: one run of memory)
    combine, identity, prologue, stat = reduction_parts(gm, red, xnode, seg)
    weights = {}  # a model's parameters, one value an element of a row (an affine weight, a bias)
    for n in (n for n in gm.graph.nodes if n.op == "get_attr"):
        if tuple(shapes.get(n, ())) != shape[dim:]:
            raise Unsupported(
                f"a parameter `{n.target}` of shape {tuple(shapes.get(n, ()))} beside rows of {shape[dim:]}"
            )
        weights[n] = f"p[{len(weights)}]"
    if side.get(res) == {"x", "r"}:  # x rewritten with its rows' statistic
        what = f"x rewritten with its rows' {stat_name(gm, red, carrier)} ({seg} elements a row)"
        env = {**rewrite_env(gm, xnode, carrier), **weights}
        finalize, apply = stat, Emitter(gm, env, vector=False).expr(res)
    elif side.get(res) == {"r"}:  # a value a row: what the output makes of the statistic
        what = f"the {red.kind} of each row ({seg} elements a row)"
        finalize, apply = Emitter(gm, {carrier: f"({stat})"}, vector=False).expr(res), None
    else:
        raise Unsupported("a reduction along the last dim whose output is neither x rewritten nor its statistic")
    return {
        "what": what,
        "moments": False,
        "with_index": red.kind in ("argmax", "argmin"),  # the prologue's (x, r): r the index in the row
        "prologue": prologue,
        "finalize": finalize,
        "combine": combine,
        "identity": identity,
        "apply": apply,
        "mode": "groups",
        "groups_per_item": math.prod(shape[1:dim]),
        "seg_len": seg,
        "param_mul": 0,
        "param_div": 1,
        "norm_params": [str(n.target).replace(".", "_") for n in weights],
        "x": spec.tensors[0].name,
    }
