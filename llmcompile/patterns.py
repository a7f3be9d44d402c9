"""Match a problem's torch program to a kernel template, and write the kernel that instantiates it.

The problem's model is traced with torch.fx (on the meta device: no memory, no time) and its
graph is read as one of the shapes of work the templates in `reference_kernels/` implement:

- map: every node elementwise (activations, scalings, broadcasts of a per-row vector);
- strided: one reduction along a middle dim, with an elementwise prologue before it, an
  epilogue on its result and, for a norm, an elementwise rewrite of the input with it;
- scan: one cumsum / cumprod along the last dim (reversed by flips, made exclusive by a
  shifted concatenation, with an elementwise prologue such as a mask);
- total: a whole tensor folded to a value (losses, a Frobenius norm and its rewrite), and the
  reduced losses whose rows come first (cross-entropy: the reference kernel's rows' losses;
  a triplet margin loss: the norm template's), folded by it;
- norm: statistics of groups then a rewrite (BatchNorm with batch statistics, InstanceNorm,
  GroupNorm, LayerNorm over trailing dims, x rewritten with a statistic of its last dim), or a
  value a group (a matrix-vector product: rows folded against the vector);
- pool: max and average pooling modules over 1-3 spatial dims;
- attention_tf32: scaled_dot_product_attention of fp32 inputs with wide heads and short rows (the
  bf16/fp16 reference kernels are built-in ops of their own);
- softmax / log_softmax along the last dim of a 2-D input: the reference kernels themselves.

A match renders a kernel module (prompts/candidates/*.py.j2) that the judge treats like any
candidate. Anything else is a `NoMatch` that says which node no template covers.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from llmcompile import prompting
from llmcompile.ops import OpSpec


@dataclass(frozen=True)
class Match:
    pattern: str  # the reference_kernels template it instantiates (map, strided, scan, total, norm, pool, attention_tf32) | softmax | log_softmax
    summary: str  # what was matched, in a line
    source: str  # the kernel module
    jinja: str = ""  # the template that wrote it (prompts/candidates/), "" for a reference kernel
    context: dict = field(default_factory=dict)  # what it was rendered with


@dataclass(frozen=True)
class NoMatch:
    reason: str


class _Unsupported(Exception):
    pass


# --------------------------------------------------------------------------- the graph

_FUNCS: dict[Any, str] = {
    torch.relu: "relu",
    F.relu: "relu",
    torch.sigmoid: "sigmoid",
    F.sigmoid: "sigmoid",
    torch.tanh: "tanh",
    F.tanh: "tanh",
    F.gelu: "gelu",
    torch.selu: "selu",
    F.selu: "selu",
    F.hardsigmoid: "hardsigmoid",
    F.softplus: "softplus",
    F.softsign: "softsign",
    F.elu: "elu",
    F.hardtanh: "hardtanh",
    F.leaky_relu: "leaky_relu",
    F.silu: "silu",
    torch.abs: "abs",
    torch.exp: "exp",
    torch.log: "log",
    torch.sqrt: "sqrt",
    torch.rsqrt: "rsqrt",
    torch.pow: "pow",
    operator.pow: "pow",
    operator.mul: "mul",
    torch.mul: "mul",
    operator.add: "add",
    torch.add: "add",
    operator.sub: "sub",
    torch.sub: "sub",
    operator.truediv: "truediv",
    torch.div: "truediv",
    operator.neg: "neg",
    torch.neg: "neg",
    torch.sum: "sum",
    torch.mean: "mean",
    torch.amax: "amax",
    torch.amin: "amin",
    torch.max: "max",
    torch.min: "min",
    torch.argmax: "argmax",
    torch.argmin: "argmin",
    torch.norm: "norm",
    torch.clamp: "clamp",
    torch.clamp_min: "clamp",
    F.mse_loss: "mse_loss",
    F.l1_loss: "l1_loss",
    F.smooth_l1_loss: "smooth_l1_loss",
    F.kl_div: "kl_div",
    torch.cumsum: "cumsum",
    torch.cumprod: "cumprod",
    torch.softmax: "softmax",
    F.softmax: "softmax",
    torch.log_softmax: "log_softmax",
    F.log_softmax: "log_softmax",
    torch.flip: "flip",
    torch.cat: "cat",
    torch.zeros_like: "zeros_like",
    torch.narrow: "narrow",
    torch.select: "select",
    torch.unsqueeze: "unsqueeze",
    operator.getitem: "getitem",
}
_MODULES: dict[type, str] = {
    nn.ReLU: "relu",
    nn.Sigmoid: "sigmoid",
    nn.Tanh: "tanh",
    nn.GELU: "gelu",
    nn.SELU: "selu",
    nn.Hardsigmoid: "hardsigmoid",
    nn.Softplus: "softplus",
    nn.Softsign: "softsign",
    nn.ELU: "elu",
    nn.Hardtanh: "hardtanh",
    nn.LeakyReLU: "leaky_relu",
    nn.SiLU: "silu",
    nn.Softmax: "softmax",
    nn.LogSoftmax: "log_softmax",
}
# parameters of the elementwise functions, in order, with torch's defaults
_PARAMS: dict[str, tuple[tuple[str, Any], ...]] = {
    "gelu": (("approximate", "none"),),
    "softplus": (("beta", 1.0), ("threshold", 20.0)),
    "elu": (("alpha", 1.0),),
    "hardtanh": (("min_val", -1.0), ("max_val", 1.0)),
    "leaky_relu": (("negative_slope", 0.01),),
}
UNARY = frozenset(
    {"relu", "sigmoid", "tanh", "gelu", "selu", "hardsigmoid", "softplus", "softsign", "elu", "hardtanh"}
    | {"leaky_relu", "silu", "abs", "exp", "log", "sqrt", "rsqrt", "neg"}
)
BINARY = frozenset({"mul", "add", "sub", "truediv", "pow"})
REDUCTIONS = frozenset({"sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "norm"})
# losses with a reduction of their own ('mean' unless told): an elementwise term, then a total
LOSSES = frozenset({"mse_loss", "l1_loss", "smooth_l1_loss", "kl_div"})
SCANS = frozenset({"cumsum", "cumprod"})
VIEWS = frozenset({"unsqueeze", "view", "reshape", "contiguous"})


@dataclass
class Op:
    """A call node, normalised: its kind, tensor/constant arguments, and named parameters."""

    node: fx.Node
    kind: str
    args: list[Any]
    kw: dict[str, Any] = field(default_factory=dict)


def _op(gm: fx.GraphModule, node: fx.Node) -> Op:
    if node.op == "call_function":
        kind = _FUNCS.get(node.target)
        if kind is None:
            raise _Unsupported(f"`{getattr(node.target, '__name__', node.target)}`")
        return Op(node, kind, list(node.args), dict(node.kwargs))
    if node.op == "call_method":
        name = str(node.target)
        kind = {"div": "truediv", "clamp_min": "clamp"}.get(name, name)
        return Op(node, kind, list(node.args), dict(node.kwargs))
    if node.op == "call_module":
        mod = gm.get_submodule(str(node.target))
        kind = _MODULES.get(type(mod))
        if kind is None:
            raise _Unsupported(f"module `{type(mod).__name__}`")
        kw = {k: getattr(mod, k) for k, _ in _PARAMS.get(kind, ()) if hasattr(mod, k)}
        if kind in ("softmax", "log_softmax"):
            kw["dim"] = mod.dim
        return Op(node, kind, list(node.args), kw)
    raise _Unsupported(f"node `{node.op}` {node.target}")


def _trace(spec: OpSpec) -> tuple[fx.GraphModule, list, dict[fx.Node, torch.Size]]:
    from llmcompile.kernelbench import model_of

    model, given = model_of(spec)
    try:
        gm = fx.symbolic_trace(model)
    except Exception as e:  # noqa: BLE001 - data-dependent control flow, etc.
        raise _Unsupported(f"torch.fx cannot trace the model ({type(e).__name__}: {e})") from None
    from torch.fx.passes.shape_prop import ShapeProp

    try:
        ShapeProp(gm).propagate(*given)
    except Exception as e:  # noqa: BLE001
        raise _Unsupported(f"shapes do not propagate on the meta device ({type(e).__name__}: {e})") from None
    shapes = {n: tm.shape for n in gm.graph.nodes if hasattr(tm := n.meta.get("tensor_meta"), "shape")}
    return gm, given, shapes


# --------------------------------------------------------------------------- expressions


def _lit(v: Any) -> str:
    if isinstance(v, bool):
        return repr(v)
    if isinstance(v, (int, float)):
        return ("-math.inf" if v < 0 else "math.inf") if math.isinf(v) else repr(float(v))
    if isinstance(v, str):
        return repr(v)
    raise _Unsupported(f"constant {v!r}")


def _param_args(op: Op, start: int) -> list[str]:
    """Named parameters of an elementwise function as literals, positional ones included."""
    out = []
    for i, (name, default) in enumerate(_PARAMS.get(op.kind, ())):
        v = op.kw.get(name, op.args[start + i] if len(op.args) > start + i else default)
        if v != default:
            out.append(f"{name}={_lit(v)}")
    return out


class Emitter:
    """Expressions in CuTe DSL for elementwise nodes. `vector`: operands are fp32 TensorSSA
    vectors (the map template, where M.* functions apply); else fp32 scalars (a reduction's
    prologue and epilogue: arithmetic and cute.math only)."""

    def __init__(self, gm: fx.GraphModule, env: dict[fx.Node, str], vector: bool) -> None:
        self.gm, self.env, self.vector = gm, env, vector

    def expr(self, a: Any) -> str:
        if isinstance(a, fx.Node):
            if a in self.env:
                return self.env[a]
            self.env[a] = self._node(a)
            return self.env[a]
        return _lit(a)

    def _node(self, node: fx.Node) -> str:
        op = _op(self.gm, node)
        k = op.kind
        if k in VIEWS:
            return self.expr(op.args[0])
        if k in BINARY:
            a, b = (self.expr(x) for x in op.args[:2])
            if k == "pow":
                p = op.args[1]
                if not isinstance(p, (int, float)):
                    raise _Unsupported("a power with a tensor exponent")
                if self.vector:
                    return f"M.power({a}, {_lit(p)})"
                if float(p).is_integer() and 1 <= p <= 4:
                    return "(" + " * ".join([a] * int(p)) + ")"
                return f"cute.math.pow({a}, Float32({_lit(p)}))"
            sym = {"mul": "*", "add": "+", "sub": "-", "truediv": "/"}[k]
            if k == "add" and "alpha" in op.kw:
                b = f"({b} * {_lit(op.kw['alpha'])})"
            return f"({a} {sym} {b})"
        if k in UNARY:
            x = self.expr(op.args[0])
            if k == "neg":
                return f"(-{x})"
            if self.vector:
                return f"M.{k}({', '.join([x, *_param_args(op, 1)])})"
            scalar = {"abs": "cute.math.abs", "exp": "cute.math.exp", "log": "cute.math.log"}
            scalar |= {"sqrt": "cute.math.sqrt", "rsqrt": "cute.math.rsqrt"}
            if k not in scalar:
                raise _Unsupported(f"`{k}` around a reduction")
            return f"{scalar[k]}({x})"
        if k == "clamp":
            lo = op.kw.get("min", op.args[1] if len(op.args) > 1 else None)
            hi = op.kw.get("max", op.args[2] if len(op.args) > 2 else None)
            if not self.vector:
                x = self.expr(op.args[0])
                if lo is not None:
                    x = f"cute.arch.fmax({x}, Float32({_lit(lo)}))"
                if hi is not None:
                    x = f"cute.arch.fmin({x}, Float32({_lit(hi)}))"
                return x
            return f"M.hardtanh({self.expr(op.args[0])}, {_lit(-math.inf if lo is None else lo)}, {_lit(math.inf if hi is None else hi)})"
        raise _Unsupported(f"`{k}`")


def _nodes(gm: fx.GraphModule) -> tuple[list[fx.Node], list[fx.Node], list[fx.Node]]:
    ph = [n for n in gm.graph.nodes if n.op == "placeholder"]
    calls = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
    outs = [n for n in gm.graph.nodes if n.op == "output"]
    return ph, calls, outs


def _results(out: fx.Node) -> list[Any]:
    r = out.args[0]
    return list(r) if isinstance(r, (tuple, list)) else [r]


def _one_result(out: fx.Node, template: str) -> Any:
    """The graph's one output, for a template that writes one."""
    results = _results(out)
    if len(results) != 1:
        names = ", ".join(r.name if isinstance(r, fx.Node) else repr(r) for r in results)
        raise _Unsupported(f"a graph with {len(results)} outputs ({names}): the {template} template writes one")
    return results[0]


def _names(spec: OpSpec, given: list, ph: list[fx.Node]) -> tuple[dict[fx.Node, str], list[str], list[str]]:
    """Placeholder -> parameter name of the kernel's launch; tensor and scalar names in order."""
    env, tensors, scalars = {}, [], []
    ti = 0
    for k, (node, g) in enumerate(zip(ph, given)):
        if isinstance(g, torch.Tensor):
            env[node] = f"in{ti}"
            tensors.append(f"in{ti}")
            ti += 1
        else:
            env[node] = f"arg{k}"
            scalars.append(f"arg{k}")
    return env, tensors, scalars


def _launch_params(spec: OpSpec) -> list[tuple[str, str]]:
    """(name, annotation) of the launch's parameters, in kernel-contract order."""
    params = [(t.name, "cute.Tensor") for t in spec.tensors]
    params += [(s, "cutlass.Int64" if isinstance(v, int) else "cutlass.Float32") for s, v in spec.scalars.items()]
    return params


# --------------------------------------------------------------------------- patterns


def _match_map(spec: OpSpec, gm: fx.GraphModule, given: list, shapes: dict) -> dict | None:
    ph, calls, (out,) = _nodes(gm)
    results = _results(out)
    if not calls or not all(isinstance(r, fx.Node) and r in shapes for r in results):
        return None  # (a graph of no calls returns its input: nothing to write)
    oshape = shapes[results[0]]
    if any(shapes[r] != oshape for r in results) or len(oshape) < 1:
        return None
    kinds_of = {op.kind for op in (_op(gm, n) for n in calls)}
    if not kinds_of <= (UNARY | BINARY | VIEWS | {"clamp"}):
        return None
    env, tensors, scalars = _names(spec, given, ph)
    tens = [(n, g) for n, g in zip(ph, given) if isinstance(g, torch.Tensor)]
    kinds = []
    for _node, g in tens:
        if tuple(g.shape) == tuple(oshape):
            kinds.append("full")
        elif g.dim() >= 1 and g.numel() == oshape[0] and len(oshape) >= 2:
            kinds.append("row")  # one value per leading index, broadcast along the rest
        else:
            return None
    # a row operand is only viewed (unsqueezed) before it meets a full one
    for (node, _), kind in zip(tens, kinds):
        if kind == "row" and any(_op(gm, u).kind in VIEWS and len(u.users) == 0 for u in node.users):
            return None
    em = Emitter(gm, env, vector=True)
    exprs = [em.expr(r) for r in results]
    return {"kinds": kinds, "tensors": tensors, "scalars": scalars, "exprs": exprs, "ops": sorted(kinds_of)}


_REDUCE = {
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


def _reduce_dim(op: Op) -> Any:
    """The dim a reduction call names (norm's comes after p); None: the whole tensor."""
    at = 2 if op.kind == "norm" else 1
    return op.kw.get("dim", op.args[at] if len(op.args) > at else None)


def _norm_as_sum(op: Op) -> tuple[str, str, Any]:
    """A norm as a sum: how the prologue wraps an element `{x}`, how the epilogue wraps the
    sum `{s}`, and the norm's p."""
    p = op.kw.get("p", op.args[1] if len(op.args) > 1 else "fro")
    if p in (2, 2.0, "fro"):
        return "({x} * {x})", "cute.math.sqrt({s})", p
    if p in (1, 1.0):
        return "cute.math.abs({x})", "{s}", p
    raise _Unsupported(f"norm p={p!r}")


def _depends(gm: fx.GraphModule, inputs: set[fx.Node], result: fx.Node) -> dict[fx.Node, set[str]]:
    """What each node depends on: the inputs directly ("x"), the reduction's `result` ("r"),
    or both; so the output reads as a function of the result alone, or the input rewritten with it."""
    side: dict[fx.Node, set[str]] = {n: {"x"} for n in inputs}
    for n in gm.graph.nodes:
        if n is result:
            side[n] = {"r"}
        elif n.op in ("call_function", "call_method", "call_module"):
            side[n] = set().union(*(side.get(a, set()) for a in n.all_input_nodes))
    return side


def _reduction(gm: fx.GraphModule, calls: list[fx.Node], shapes: dict) -> tuple[Op, fx.Node, int]:
    """The graph's one reduction: its op, the node carrying its result (a getitem of
    max/min's pair), and the reduced dim of its input."""
    reds = [op for op in (_op(gm, n) for n in calls) if op.kind in REDUCTIONS]
    if len(reds) != 1:
        raise _Unsupported(f"{len(reds)} reductions (the templates fuse one)")
    r = reds[0]
    dim = _reduce_dim(r)
    if isinstance(dim, (list, tuple)) and len(dim) == 1:
        dim = dim[0]
    if not isinstance(dim, int):
        raise _Unsupported(f"`{r.kind}` over {dim!r}: the templates reduce one dim")
    x = r.args[0]
    rank = len(shapes[x])
    carrier = r.node
    if r.kind in ("max", "min"):
        users = list(r.node.users)
        if len(users) != 1 or _op(gm, users[0]).kind != "getitem":
            raise _Unsupported(f"`{r.kind}` with values and indices")
        idx = users[0].args[1]
        r = Op(
            r.node,
            {("max", 0): "max", ("min", 0): "min", ("max", 1): "argmax", ("min", 1): "argmin"}[(r.kind, idx)],
            r.args,
            r.kw,
        )
        carrier = users[0]
    return r, carrier, dim % rank


def _match_strided(spec: OpSpec, gm: fx.GraphModule, given: list, shapes: dict) -> dict | None:
    ph, calls, (out,) = _nodes(gm)
    tens = [(n, g) for n, g in zip(ph, given) if isinstance(g, torch.Tensor)]
    if len(tens) != 1 or not any(_op(gm, n).kind in REDUCTIONS for n in calls):
        return None
    xnode = tens[0][0]
    red, carrier, dim = _reduction(gm, calls, shapes)
    rank = len(shapes[xnode])
    if dim == 0:
        raise _Unsupported("a reduction over the batch dim")
    if dim == rank - 1:
        return None  # the norm template's (a rewrite with a row statistic), else nobody's
    r_len = shapes[xnode][dim]
    env, _, _ = _names(spec, given, ph)
    side = _depends(gm, {xnode}, carrier)
    res = _one_result(out, "strided")
    kind, wrap, post = red.kind, "{x}", "{s}"
    if kind == "norm":
        wrap, post, _ = _norm_as_sum(red)
        kind = "sum"
    combine, identity, pro_fmt, epi = _REDUCE[kind]
    pro = wrap.format(x=Emitter(gm, {xnode: "x"}, vector=False).expr(red.args[0]))
    epi = post.format(s=epi.format(inv_r=_lit(1.0 / r_len)))
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
        "identity": ", ".join(_lit(v) for v in identity) + ",",
        "prologue": pro_fmt.format(x=pro),
        "epilogue": epilogue,
        "rewrite": rewrite,
        "reduction": red.kind,
        "x": env[xnode],
    }


def _loss_term(op: Op, em: Emitter) -> tuple[str, str]:
    """A loss function's elementwise term (in torch's formula) and its reduction."""
    a, b = (em.expr(x) for x in op.args[:2])
    red = op.kw.get("reduction", "mean")
    if op.kw.get("size_average") is not None or op.kw.get("reduce") is not None:
        raise _Unsupported(f"`{op.kind}` with the deprecated size_average/reduce")
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
            term = f"cutlass.select_({d} < {_lit(beta)}, 0.5 * {d} * {d} / {_lit(beta)}, {d} - {_lit(0.5 * beta)})"
    else:  # kl_div(input, target): target * (log(target) - input), 0 where target is 0 (xlogy)
        if op.kw.get("log_target", False):
            term = f"cute.math.exp({b}) * ({b} - {a})"
        else:
            term = f"cutlass.select_({b} > 0.0, {b} * (cute.math.log({b}) - {a}), Float32(0.0))"
    if red not in ("mean", "sum", "batchmean") or (red == "batchmean" and op.kind != "kl_div"):
        raise _Unsupported(f"`{op.kind}` with reduction={red!r}")
    return term, {"mean": "acc[0] / count", "sum": "acc[0]", "batchmean": "acc[0] / rows"}[red]


def _match_total(spec: OpSpec, gm: fx.GraphModule, given: list, shapes: dict) -> dict | None:
    ph, calls, (out,) = _nodes(gm)
    ops = [_op(gm, n) for n in calls]
    reds = [op for op in ops if op.kind in REDUCTIONS | LOSSES]
    if len(reds) != 1:
        return None
    red = reds[0]
    if red.kind in REDUCTIONS and (_reduce_dim(red) is not None or red.kind in ("argmax", "argmin")):
        return None  # along a dim: another template's
    tens = [(n, g) for n, g in zip(ph, given) if isinstance(g, torch.Tensor)]
    full = tuple(shapes[red.args[0]])
    kinds = []
    for _, g in tens:
        if tuple(g.shape) == full:
            kinds.append("full")
        elif g.dim() == 1 and len(full) >= 1 and g.shape[0] == full[-1]:
            kinds.append("col")  # broadcast along the last dim
        else:
            raise _Unsupported(f"an input of shape {tuple(g.shape)} beside a reduction of {full}")
    if not kinds or kinds[0] != "full":
        raise _Unsupported("a whole-tensor reduction whose first input is broadcast")
    env, tensors, scalars = _names(spec, given, ph)
    em = Emitter(gm, dict(env), vector=False)
    if red.kind in LOSSES:
        pro, epi = _loss_term(red, em)
        combine, identity, what = "S.add", (0.0,), red.kind
    else:
        kind, wrap, post, what = red.kind, "{x}", "{s}", red.kind
        if kind == "norm":
            wrap, post, p = _norm_as_sum(red)
            kind, what = "sum", f"norm (p={p})"
        # the strided reductions' combines; a mean divides by the elements of this call's tensor
        combine, identity, _, epi = _REDUCE[kind]
        epi = post.format(s="acc[0] / count" if kind == "mean" else epi)
        pro = wrap.format(x=em.expr(red.args[0]))
    side = _depends(gm, {n for n, _ in tens}, red.node)
    res = _one_result(out, "total")
    rewrite = None
    if side.get(res) == {"r"}:
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
        "identity": ", ".join(_lit(v) for v in identity) + ",",
        "kinds_repr": repr(tuple(kinds)),
        "tensors": tensors,
        "scalars": scalars,
        "reduction": what,
    }


def _only_module(gm: fx.GraphModule, inputs: int) -> tuple[list[fx.Node], nn.Module] | None:
    """The graph's placeholders and its one module, when the graph is that module called on its
    `inputs` inputs and returning its result."""
    ph, calls, (out,) = _nodes(gm)
    if len(calls) != 1 or calls[0].op != "call_module" or _results(out) != [calls[0]] or len(ph) != inputs:
        return None
    if list(calls[0].args[:inputs]) != ph:
        return None
    return ph, gm.get_submodule(str(calls[0].target))


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


def _norm_module(spec: OpSpec, gm: fx.GraphModule, given: list, shapes: dict) -> dict | None:
    """A BatchNorm / InstanceNorm / GroupNorm / LayerNorm module applied to the one input:
    its groups and its affine parameters' indexing (see reference_kernels/norm.py)."""
    only = _only_module(gm, 1)
    if only is None or not isinstance(only[1], _NORM_MODULES):
        return None
    ph, mod = only
    shape = tuple(shapes[ph[0]])
    rank = len(shape)
    name = type(mod).__name__
    if isinstance(mod, nn.LayerNorm):
        k = len(mod.normalized_shape)
        if tuple(shape[rank - k :]) != tuple(mod.normalized_shape) or k >= rank:
            raise _Unsupported(f"`{name}` over {tuple(mod.normalized_shape)} of an input {shape}")
        mode, gpi, seg = "groups", math.prod(shape[1 : rank - k]), math.prod(shape[rank - k :])
        mul, div = 0, 1  # a weight per normalized element
        what = f"LayerNorm over the last {k} dims ({seg} elements a group)"
    else:
        if rank < 2 or shape[1] != getattr(mod, "num_features", getattr(mod, "num_channels", None)):
            raise _Unsupported(f"`{name}` of an input {shape}")
        # BatchNorm and InstanceNorm: the kernel is passed no running statistics to use
        if isinstance(mod, nn.modules.batchnorm._NormBase) and not mod.training and mod.track_running_stats:
            raise _Unsupported(f"`{name}` in eval mode (running statistics)")
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
        raise _Unsupported(f"`{name}` with parameters {affine}")
    apply = "(x - s[0]) * s[1]" + " * p[0]" * (len(affine) >= 1) + " + p[1]" * (len(affine) == 2)
    return {
        "what": what,
        "moments": True,
        "eps": _lit(float(mod.eps)),
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


_POOL_MODULES = {
    nn.MaxPool1d: ("max", 1),
    nn.MaxPool2d: ("max", 2),
    nn.MaxPool3d: ("max", 3),
    nn.AvgPool1d: ("avg", 1),
    nn.AvgPool2d: ("avg", 2),
    nn.AvgPool3d: ("avg", 3),
}


def _match_pool(spec: OpSpec, gm: fx.GraphModule, given: list, shapes: dict) -> dict | None:
    """A max or average pooling module applied to the one input."""
    only = _only_module(gm, 1)
    if only is None or type(only[1]) not in _POOL_MODULES:
        return None
    ph, mod = only
    kind, dims = _POOL_MODULES[type(mod)]
    name = type(mod).__name__
    shape = tuple(shapes[ph[0]])
    if len(shape) != dims + 2:
        raise _Unsupported(f"`{name}` of an input {shape} (the template takes (N, C, *spatial))")
    if getattr(mod, "ceil_mode", False) or getattr(mod, "return_indices", False):
        raise _Unsupported(f"`{name}` with ceil_mode or return_indices")
    window = {k: getattr(mod, k) for k in ("kernel_size", "stride", "padding")}
    window = {k: tuple(v) if isinstance(v, (list, tuple)) else v for k, v in window.items()}
    what = f"{kind} pooling over {dims}-D windows {window['kernel_size']}, stride {window['stride']}"
    return {
        "what": what,
        "kind": kind,
        "kernel": window["kernel_size"],
        "stride": window["stride"],
        "padding": window["padding"],
        "dilation": getattr(mod, "dilation", 1),
        "count_include_pad": bool(getattr(mod, "count_include_pad", True)),
        "divisor_override": getattr(mod, "divisor_override", None),
        "x": spec.tensors[0].name,
    }


_MATMULS = (torch.matmul, torch.mm, torch.mv, operator.matmul)


def _match_gemv(spec: OpSpec, gm: fx.GraphModule, given: list, shapes: dict) -> dict | None:
    """A matrix times a vector, (M, K) @ (K, 1) or (K,): each row folded with the vector."""
    ph, calls, (out,) = _nodes(gm)
    if len(calls) != 1 or calls[0].op != "call_function" or calls[0].target not in _MATMULS or len(ph) != 2:
        return None
    if list(calls[0].args[:2]) != ph or _results(out) != [calls[0]]:
        return None
    a, b = (tuple(shapes[n]) for n in ph)
    if len(a) != 2 or b not in ((a[1], 1), (a[1],)):
        raise _Unsupported(f"`matmul` of {a} by {b} (the template takes a matrix times a vector)")
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


def _match_cross_entropy(spec: OpSpec, gm: fx.GraphModule, given: list, shapes: dict) -> dict | None:
    """`F.cross_entropy(logits (M, C), targets (M,))` reduced to a mean or a sum: the rows'
    losses from the cross-entropy reference kernel, then a whole-tensor fold of them."""
    ph, calls, (out,) = _nodes(gm)
    if len(calls) != 1 or calls[0].target is not F.cross_entropy or _results(out) != [calls[0]] or len(ph) != 2:
        return None
    node = calls[0]
    if list(node.args[:2]) != ph:
        return None
    x, t = (tuple(shapes[n]) for n in ph)
    kw = dict(node.kwargs)
    extra = {k: v for k, v in kw.items() if k not in ("reduction", "ignore_index")}
    if len(node.args) > 2 or any(v not in (None, 0.0) for v in extra.values()):
        raise _Unsupported(f"`cross_entropy` with {sorted(extra) or 'positional options'}")
    red = kw.get("reduction", "mean")
    if len(x) != 2 or t != (x[0],) or given[1].dtype != torch.int64 or red not in ("mean", "sum"):
        raise _Unsupported(f"`cross_entropy` of {x} and {t} with reduction={red!r}")
    return {
        "what": f"cross-entropy over {x[1]} classes, the {red} over rows",
        "ignore_index": int(kw.get("ignore_index", -100)),
        "epilogue": "acc[0] / acc[1]" if red == "mean" else "acc[0]",
        "x": spec.tensors[0].name,
        "target": spec.tensors[1].name,
    }


_SDPA_DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}


def _match_attention(spec: OpSpec, gm: fx.GraphModule, given: list, shapes: dict) -> dict | None:
    """`F.scaled_dot_product_attention(q, k, v)` of three (B, H, N, D) fp32 inputs, no mask:
    the fp32 attention kernel for wide heads (reference_kernels/attention_tf32.py)."""
    ph, calls, (out,) = _nodes(gm)
    if len(calls) != 1 or calls[0].target is not F.scaled_dot_product_attention or _results(out) != [calls[0]]:
        return None
    node = calls[0]
    if list(node.args[:3]) != ph or len(ph) != 3 or len(given) != 3:
        return None
    names = list(_SDPA_DEFAULTS)
    opts = {**_SDPA_DEFAULTS, **dict(zip(names, node.args[3:])), **node.kwargs}
    other = {k: v for k, v in opts.items() if k != "scale" and v != _SDPA_DEFAULTS[k]}
    shape = tuple(shapes[ph[0]])
    if other or not (opts["scale"] is None or isinstance(opts["scale"], (int, float))):
        raise _Unsupported(f"`scaled_dot_product_attention` with {sorted(other) or ['a tensor scale']}")
    from reference_kernels.attention_tf32 import check_shape

    why = check_shape(shape[-2], shape[-1]) if len(shape) == 4 else "inputs of rank 4"
    if any(tuple(shapes[n]) != shape for n in ph) or any(g.dtype != torch.float32 for g in given) or why:
        raise _Unsupported(
            f"`scaled_dot_product_attention` of {[tuple(shapes[n]) for n in ph]} (the fp32 kernel takes {why or 'three equal fp32 shapes'})"
        )
    scale = 1.0 / math.sqrt(shape[-1]) if opts["scale"] is None else float(opts["scale"])
    return {
        "what": f"softmax attention over {shape[2]} keys, head dim {shape[3]}, fp32 (TF32 tensor cores)",
        "scale": _lit(scale),
        "ins": [t.name for t in spec.tensors[:3]],
    }


def _match_triplet(spec: OpSpec, gm: fx.GraphModule, given: list, shapes: dict) -> dict | None:
    """`nn.TripletMarginLoss` (p = 2) of three (M, D) inputs: each row's loss from its two
    distances, then their mean or sum."""
    only = _only_module(gm, 3)
    if only is None or not isinstance(only[1], nn.TripletMarginLoss):
        return None
    ph, mod = only
    shape = tuple(shapes[ph[0]])
    if len(shape) != 2 or any(tuple(shapes[n]) != shape for n in ph) or spec.scalars:
        raise _Unsupported(f"`TripletMarginLoss` of inputs {[tuple(shapes[n]) for n in ph]}")
    if float(mod.p) != 2.0 or mod.swap or mod.reduction not in ("mean", "sum"):
        raise _Unsupported(f"`TripletMarginLoss` with p={mod.p}, swap={mod.swap}, reduction={mod.reduction!r}")
    return {
        "what": f"triplet margin loss over rows of {shape[1]}, the {mod.reduction} over rows",
        "margin": _lit(float(mod.margin)),
        "eps": _lit(float(mod.eps)),
        "dim": shape[1],
        "epilogue": "acc[0] / count" if mod.reduction == "mean" else "acc[0]",
        "ins": [t.name for t in spec.tensors[:3]],
    }


def _norm_of_rows(spec: OpSpec, gm: fx.GraphModule, given: list, shapes: dict) -> dict | None:
    """x rewritten with a statistic of its last dim (x / mean(|x|), x / ||x||): groups of a row."""
    ph, calls, (out,) = _nodes(gm)
    tens = [(n, g) for n, g in zip(ph, given) if isinstance(g, torch.Tensor)]
    if len(tens) != 1 or len(given) != 1 or not any(_op(gm, n).kind in REDUCTIONS for n in calls):
        return None
    xnode = tens[0][0]
    red, carrier, dim = _reduction(gm, calls, shapes)
    shape = tuple(shapes[xnode])
    if dim != len(shape) - 1 or red.kind in ("argmax", "argmin") or len(shape) < 2:
        return None
    side = _depends(gm, {xnode}, carrier)
    res = _one_result(out, "norm")
    if side.get(res) != {"x", "r"}:
        raise _Unsupported("a reduction along the last dim without a rewrite of x")
    kind, wrap, post = red.kind, "{x}", "{s}"
    if kind == "norm":
        wrap, post, _ = _norm_as_sum(red)
        kind = "sum"
    combine, identity, _, epi = _REDUCE[kind]
    seg = shape[-1]
    return {
        "what": f"x rewritten with its rows' {red.kind} ({seg} elements a row)",
        "moments": False,
        "prologue": wrap.format(x=Emitter(gm, {xnode: "x"}, vector=False).expr(red.args[0])),
        "finalize": post.format(s=epi.format(inv_r=_lit(1.0 / seg))),
        "combine": combine,
        "identity": ", ".join(_lit(v) for v in identity) + ",",
        "apply": Emitter(gm, {xnode: "x", carrier: "s[0]"}, vector=False).expr(res),
        "mode": "groups",
        "groups_per_item": math.prod(shape[1:-1]),
        "seg_len": seg,
        "param_mul": 0,
        "param_div": 1,
        "norm_params": [],
        "x": spec.tensors[0].name,
    }


def _match_scan(spec: OpSpec, gm: fx.GraphModule, given: list, shapes: dict) -> dict | None:
    ph, calls, (out,) = _nodes(gm)
    ops = {n: _op(gm, n) for n in calls}
    scans = [op for op in ops.values() if op.kind in SCANS]
    if len(scans) != 1:
        return None
    sc = scans[0]
    dim = sc.kw.get("dim", sc.args[1] if len(sc.args) > 1 else None)
    src = sc.args[0]
    rank = len(shapes[src])
    if not isinstance(dim, int) or dim % rank != rank - 1:
        raise _Unsupported(f"a scan along dim {dim} (the scan template takes the last dim)")
    res = _one_result(out, "scan")
    reverse = exclusive = False
    n_len = shapes[src][-1]

    def is_last_flip(node: Any) -> bool:
        if not isinstance(node, fx.Node) or node not in ops or ops[node].kind != "flip":
            return False
        dims = ops[node].kw.get("dims", ops[node].args[1] if len(ops[node].args) > 1 else None)
        dims = [dims] if isinstance(dims, int) else list(dims or [])
        return [d % rank for d in dims] == [rank - 1]

    if is_last_flip(res) and is_last_flip(src):
        reverse, res, src = True, res.args[0], src.args[0]
    if isinstance(res, fx.Node) and res in ops and ops[res].kind == "cat":
        parts = ops[res].args[0]
        if (
            len(parts) == 2
            and ops.get(parts[0]) is not None
            and ops[parts[0]].kind == "zeros_like"
            and parts[1] is sc.node
            and src in ops
            and ops[src].kind == "narrow"
        ):
            nw = ops[src]
            start = nw.kw.get("start", nw.args[2] if len(nw.args) > 2 else None)
            length = nw.kw.get("length", nw.args[3] if len(nw.args) > 3 else None)
            if start == 0 and (length == n_len - 1 or _is_len_minus_one(gm, length)):
                exclusive, res, src = True, sc.node, nw.args[0]
    if res is not sc.node:
        return None
    _, tensors, _ = _names(spec, given, ph)
    pro_env = {}
    # input i's element is v[i]; masks arrive as Boolean elements: multiply by them through a select
    for i, (n, g) in enumerate((n, g) for n, g in zip(ph, given) if isinstance(g, torch.Tensor)):
        pro_env[n] = (
            f"cutlass.select_(v[{i}], Float32(1.0), Float32(0.0))" if g.dtype == torch.bool else f"Float32(v[{i}])"
        )
    pro = Emitter(gm, pro_env, vector=False).expr(src)
    return {
        "combine": "S.add" if sc.kind == "cumsum" else "S.mul",
        "identity": _lit(0.0 if sc.kind == "cumsum" else 1.0),
        "prologue": pro,
        "reverse": reverse,
        "exclusive": exclusive,
        "inputs": tensors,
        "kind": sc.kind,
    }


def _is_len_minus_one(gm: fx.GraphModule, node: Any) -> bool:
    """`x.size(d) - 1`, as traced."""
    if not isinstance(node, fx.Node) or node.op == "placeholder" or _op(gm, node).kind != "sub":
        return False
    size, one = node.args[:2]
    return one == 1 and isinstance(size, fx.Node) and size.op == "call_method" and size.target == "size"


def _match_rowop(spec: OpSpec, gm: fx.GraphModule, given: list, shapes: dict) -> str | None:
    ph, calls, (out,) = _nodes(gm)
    if len(calls) != 1 or len(given) != 1:
        return None
    op = _op(gm, calls[0])
    if op.kind not in ("softmax", "log_softmax") or _results(out) != [calls[0]]:
        return None
    dim = op.kw.get("dim", op.args[1] if len(op.args) > 1 else None)
    rank = len(shapes[ph[0]])
    if rank != 2 or not isinstance(dim, int) or dim % rank != 1 or given[0].dtype != torch.float32:
        return None
    return op.kind


# Graphs that are one call of a known module or function, tried first: (matcher, the template
# it instantiates, the jinja that writes it when not the template's own)
_WHOLE_GRAPH = (
    (_norm_module, "norm", ""),
    (_match_triplet, "total", "triplet_total"),
    (_match_cross_entropy, "total", "cross_entropy_total"),
    (_match_gemv, "norm", ""),
    (_match_pool, "pool", ""),
    (_match_attention, "attention_tf32", ""),
)


def match(spec: OpSpec) -> Match | NoMatch:
    """The template this problem's torch program matches, with its kernel; or why none does.
    Never raises: a graph the matcher itself cannot read is "not attempted", with the reason."""
    try:
        return _match(spec)
    except Exception as e:  # noqa: BLE001 - a gap in the matcher, never the user's traceback
        return NoMatch(f"no template matches this graph: the matcher stopped on it ({type(e).__name__}: {e})")


def _match(spec: OpSpec) -> Match | NoMatch:
    if not spec.source_path:
        return NoMatch(f"{spec.name} is a built-in op: its reference kernel is the offline default")
    try:
        gm, given, shapes = _trace(spec)
        params = _launch_params(spec)
        outs = {"outputs": [t.name for t in spec.outputs]}
        for matcher, pattern, jinja in _WHOLE_GRAPH:
            c = matcher(spec, gm, given, shapes)
            if c:
                return _rendered(pattern, c["what"], spec, params, {**c, **outs}, jinja)
        rowop = _match_rowop(spec, gm, given, shapes)
        if rowop:
            src = prompting.reference_source(rowop)
            return Match(rowop, f"{rowop} along the last dim: the reference kernel", src)
        m = _match_map(spec, gm, given, shapes)
        if m:
            ctx = {**m, "kinds_repr": repr(tuple(m["kinds"])), **outs}
            what = ", ".join(m["ops"]) or "copy"
            return _rendered("map", f"elementwise ({what}) over {', '.join(m['kinds'])} inputs", spec, params, ctx)
        w = _match_total(spec, gm, given, shapes)
        if w:
            ctx = {**w, **outs}
            what = f"{w['reduction']} of the whole tensor" + (" then a rewrite of x" if w["rewrite"] else "")
            return _rendered("total", what, spec, params, ctx)
        g = _norm_of_rows(spec, gm, given, shapes)
        if g:
            return _rendered("norm", g["what"], spec, params, {**g, **outs})
        s = _match_scan(spec, gm, given, shapes)
        if s:
            how = " reversed" * s["reverse"] + " exclusive" * s["exclusive"]
            return _rendered("scan", f"{s['kind']}{how} along the last dim", spec, params, s)
        r = _match_strided(spec, gm, given, shapes)
        if r:
            what = f"{r['reduction']} over dim {r['dim']} (R={r['r']})" + (
                " then a rewrite of x" if r["rewrite"] else ""
            )
            return _rendered("strided", what, spec, params, r)
    except _Unsupported as e:
        return NoMatch(f"no template takes {e}")
    ops = sorted({_describe(gm, n) for n in _nodes(gm)[1]})
    return NoMatch(f"no template matches this graph ({', '.join(ops) or 'no calls'})")


def _rendered(pattern: str, summary: str, spec: OpSpec, params: list, ctx: dict, jinja_name: str = "") -> Match:
    jinja = f"candidates/{jinja_name or pattern}.py.j2"
    tensor_params = [p for p in params if p[1] == "cute.Tensor"]
    ctx = {**ctx, "params": params, "tensor_params": tensor_params, "scalar_params": params[len(tensor_params) :]}
    return Match(pattern, summary, prompting.render(jinja, spec=spec, **ctx), jinja, ctx)


def render(spec: OpSpec, match: Match, knobs: str) -> str:
    """`match`'s kernel with other template knobs (e.g. "unroll=8"), as the offline search varies them."""
    if not match.jinja:
        return match.source
    return prompting.render(match.jinja, spec=spec, knobs=knobs, **match.context)


def _describe(gm: fx.GraphModule, n: fx.Node) -> str:
    try:
        return _op(gm, n).kind
    except _Unsupported as e:
        return str(e)
