"""The traced graph read as ops of a small vocabulary (elementwise functions, reductions, losses,
scans, views, modules), and the shape reads and repeats made what they are (trace.py runs the
front end's steps)."""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from llmcompile.agent.patterns.decompose import Refused
from llmcompile.specs import OpSpec


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


class Unsupported(Exception):
    pass


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
    torch.linalg.vector_norm: "vector_norm",
    torch.prod: "prod",
    torch.logsumexp: "logsumexp",
    torch.var: "var",
    torch.std: "std",
    torch.clamp: "clamp",
    torch.clamp_min: "clamp",
    F.mse_loss: "mse_loss",
    F.l1_loss: "l1_loss",
    F.smooth_l1_loss: "smooth_l1_loss",
    F.kl_div: "kl_div",
    torch.cumsum: "cumsum",
    torch.cumprod: "cumprod",
    torch.logcumsumexp: "logcumsumexp",
    torch.cummax: "cummax",
    torch.cummin: "cummin",
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
    torch.reshape: "reshape",
    torch.flatten: "flatten",
    operator.getitem: "getitem",
    getattr: "getattr",  # x.dtype, read by a cast
    operator.gt: "gt",
    torch.gt: "gt",
    operator.lt: "lt",
    torch.lt: "lt",
    operator.ge: "ge",
    torch.ge: "ge",
    operator.le: "le",
    torch.le: "le",
    operator.eq: "eq",
    torch.eq: "eq",
    operator.ne: "ne",
    torch.ne: "ne",
    torch.isnan: "isnan",
    torch.where: "where",
    torch.any: "any",
    torch.all: "all",
    torch.count_nonzero: "count_nonzero",
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
PARAMS: dict[str, tuple[tuple[str, Any], ...]] = {
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

REDUCTIONS = frozenset(
    {"sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "norm", "prod", "logsumexp", "var", "std"}
    | {"any", "all", "count_nonzero"}
)

# comparisons, 1.0 or 0.0 inside a reduction's prologue (the mask any, all and count_nonzero read)
COMPARISONS = {"gt": ">", "lt": "<", "ge": ">=", "le": "<=", "eq": "==", "ne": "!="}
# (isnan too: `x != x`, which CuTe DSL keeps as a NaN test, setp.num; where(c, a, b) selects on c != 0)

# a reduction carrying the input's values with it: softmax (exp(x - lse)), log_softmax (x - lse)
NORMALIZERS = frozenset({"softmax", "log_softmax"})

# losses with a reduction of their own ('mean' unless told): an elementwise term, then a total
LOSSES = frozenset({"mse_loss", "l1_loss", "smooth_l1_loss", "kl_div"})

SCANS = frozenset({"cumsum", "cumprod", "logcumsumexp", "cummax", "cummin"})
# (cummax and cummin return (values, indices): the scan template writes the values)

VIEWS = frozenset({"unsqueeze", "view", "reshape", "flatten", "contiguous"})

# casts between floating dtypes: the templates compute in fp32 and round once, into the output
CASTS = frozenset({"float", "to", "type_as", "bfloat16", "half"})


@dataclass
class Op:
    """A call node, normalised: its kind, tensor/constant arguments, and named parameters."""

    node: fx.Node
    kind: str
    args: list[Any]
    kw: dict[str, Any] = field(default_factory=dict)


def op_of(gm: fx.GraphModule, node: fx.Node) -> Op:
    if node.op == "call_function":
        kind = _FUNCS.get(node.target)
        if kind is None:
            raise Unsupported(f"`{getattr(node.target, '__name__', node.target)}`")
        args, kw = list(node.args), dict(node.kwargs)
        if kind == "vector_norm":  # torch.linalg.vector_norm(x, ord=2, dim=None, ...): a norm whose p is ord
            kind = "norm"
            kw["p"] = kw.pop("ord", args[1] if len(args) > 1 else 2)
            kw.setdefault("dim", args[2] if len(args) > 2 else None)
            args = args[:1]
        return Op(node, kind, args, kw)
    if node.op == "call_method":
        name = str(node.target)
        kind = {"div": "truediv", "clamp_min": "clamp"}.get(name, name)
        return Op(node, kind, list(node.args), dict(node.kwargs))
    if node.op == "call_module":
        mod = gm.get_submodule(str(node.target))
        kind = _MODULES.get(type(mod))
        if kind is None:
            raise Unsupported(f"module `{type(mod).__name__}`")
        kw = {k: getattr(mod, k) for k, _ in PARAMS.get(kind, ()) if hasattr(mod, k)}
        if kind in ("softmax", "log_softmax"):
            kw["dim"] = mod.dim
        return Op(node, kind, list(node.args), kw)
    raise Unsupported(f"node `{node.op}` {node.target}")


def _dims(spec: OpSpec, given: list, gm: fx.GraphModule) -> dict[fx.Node, tuple[int | None, ...]]:
    """Each input's and parameter's dims, None for a batchable problem's batch dim (M: its size
    varies between calls, as the judge's verify shapes do; a problem of one size is verified at
    that size only)."""
    dims: dict[fx.Node, tuple[int | None, ...]] = {}
    descs = iter(spec.inputs)
    ph = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, g in zip(ph, given):
        if isinstance(g, torch.Tensor):
            d = next(descs)
            dims[node] = tuple(None if k == "M" and spec.batchable else s for k, s in zip(d.dims, g.shape))
    for node in gm.graph.nodes:
        if node.op == "get_attr" and isinstance(t := getattr(gm, str(node.target), None), torch.Tensor):
            dims[node] = tuple(t.shape)
    return dims


def fold_shape_reads(gm: fx.GraphModule, spec: OpSpec, given: list) -> None:
    """`x.shape[-1]`, `x.size(1)`, `x.size()[i]`, `x.dim()`, `x.ndim` of an input or a parameter,
    made the constants they are (`x.sum(-1) / x.shape[-1]`: a mean); a read of the batch dim, whose
    size the kernel would have to take at run time, is refused."""
    dims = _dims(spec, given, gm)

    def const(x: Any, i: Any) -> int | tuple[int, ...]:
        if isinstance(i, slice):  # (F.rms_norm(x, x.shape[-1:]))
            sizes = dims[x][i]
            if None in sizes:
                raise Refused(
                    f"`{x.name}.shape[{i.start or ''}:{i.stop or ''}]`: the batch dim's size, known only at run time"
                )
            return tuple(s for s in sizes if s is not None)
        if not isinstance(i, int) or not -len(dims[x]) <= i < len(dims[x]):
            raise Refused(f"a read of `{x.name}`'s shape at {i!r}")
        if (size := dims[x][i]) is None:
            raise Refused(f"`{x.name}.shape[{i}]`: the batch dim's size, known only at run time")
        return size

    def is_shape(n: fx.Node) -> bool:  # x.shape, x.size()
        getattr_shape = n.op == "call_function" and n.target is getattr and n.args[1:] == ("shape",)
        return (getattr_shape or (n.op == "call_method" and n.target == "size" and len(n.args) == 1)) and (
            n.args[0] in dims
        )

    for n in list(gm.graph.nodes):
        x = n.args[0] if n.args else None
        if n.op == "call_function" and n.target is operator.getitem and isinstance(x, fx.Node) and is_shape(x):
            if _batch_kept(gm, n, x.args[0], n.args[1], dims):
                continue
            value: int | tuple[int, ...] | None = const(x.args[0], n.args[1])
        elif n.op == "call_method" and n.target == "size" and len(n.args) == 2 and x in dims:
            if _batch_kept(gm, n, x, n.args[1], dims):
                continue
            value = const(x, n.args[1])
        elif x in dims and (n.op, n.target) in (("call_method", "dim"), ("call_function", getattr)):
            value = len(dims[x]) if n.target == "dim" or n.args[1:] == ("ndim",) else None
        else:
            value = None
        if value is not None:
            _replace(gm, n, value)
    for n in reversed(list(gm.graph.nodes)):  # (a parameter read only for its shape is not an input)
        if not n.users and (is_shape(n) or n.op == "get_attr"):
            gm.graph.erase_node(n)
    for n in list(gm.graph.nodes):  # (`x.size(1) - 1` of a narrow: the number it is)
        if n.op == "call_function" and n.target in _ARITHMETIC and not n.all_input_nodes:
            _replace(gm, n, n.target(*n.args))
    gm.recompile()


def _batch_kept(gm: fx.GraphModule, n: fx.Node, x: fx.Node, i: Any, dims: dict) -> bool:
    """Where read `n` of x's batch dim only sizes the first dim of x's own view, alone or times
    x's other sizes (`x.view(x.size(0), -1)`, `x.reshape(x.shape[0], 16, 64)`, `B, T, C =
    x.size(); x.view(B * T, C)`): that view made one that keeps the batch whatever its size
    (x.flatten(1), or -1 in its place). Returns whether it was."""
    if not isinstance(i, int) or dims[x][i] is not None:
        return False
    chain, factors = [n], []  # (the read, then each product it is multiplied into)
    while len(chain[-1].users) == 1 and (u := next(iter(chain[-1].users))).op == "call_function":
        if u.target is not operator.mul or len(u.args) != 2:
            break
        factors.append(u.args[1] if u.args[0] is chain[-1] else u.args[0])
        chain.append(u)
    if len(chain[-1].users) != 1:
        return False
    (v,) = chain[-1].users
    method = v.op == "call_method" and v.target in ("view", "reshape")
    if not (method or (v.op == "call_function" and v.target is torch.reshape)) or v.args[0] is not x:
        return False
    sizes = list(v.args[1] if len(v.args) == 2 and isinstance(v.args[1], (tuple, list)) else v.args[1:])
    rest, later = dims[x][1:], [_size_of(a, x, dims) for a in sizes[1:]]
    known = [_size_of(a, x, dims) for a in factors]
    if not sizes or sizes[0] is not chain[-1] or None in rest or None in later or None in known or -1 in known:
        return False
    k = math.prod(known)
    if later == [-1] and not factors:
        with gm.graph.inserting_before(v):
            v.replace_all_uses_with(gm.graph.call_function(torch.flatten, (x, 1)))
        gm.graph.erase_node(v)
    elif later.count(-1) == 1 and math.prod(rest) % (k * -math.prod(later)) == 0:  # (the -1 made the number it is)
        v.args = (x, (-1, *(math.prod(rest) // (k * -math.prod(later)) if s == -1 else s for s in later)))
    elif -1 not in later and math.prod(later) * k == math.prod(rest):
        v.args = (x, (-1, *later))
    else:
        return False
    for c in reversed(chain):
        gm.graph.erase_node(c)
    return True


def _size_of(a: Any, x: fx.Node, dims: dict) -> int | None:
    """`a` as a number where it is one, or a read of a dim of x other than its batch dim."""
    if isinstance(a, int) and not isinstance(a, bool):
        return a
    if not isinstance(a, fx.Node) or len(a.args) != 2 or not isinstance(j := a.args[1], int):
        return None
    src = a.args[0]
    read = a.op == "call_method" and a.target == "size" and src is x  # x.size(j)
    if a.op == "call_function" and a.target is operator.getitem and isinstance(src, fx.Node):  # x.shape[j], x.size()[j]
        read = src.args[:1] == (x,) and (src.target is getattr and src.args[1:] == ("shape",) or src.target == "size")
    return dims[x][j] if read and -len(dims[x]) <= j < len(dims[x]) else None


_ARITHMETIC = (operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv, operator.neg)


def _replace(gm: fx.GraphModule, n: fx.Node, value: Any) -> None:
    """Node `n` made the constant `value` in every argument that reads it."""
    for user in list(n.users):
        user.args = fx.node.map_arg(user.args, lambda a: value if a is n else a)
        user.kwargs = fx.node.map_arg(user.kwargs, lambda a: value if a is n else a)
    gm.graph.erase_node(n)


_IMPURE = ("rand", "dropout", "bernoulli", "normal", "multinomial", "poisson")


def merge_repeats(gm: fx.GraphModule) -> None:
    """The same call on the same arguments, written twice (`x + y` in each of two outputs, a
    statistic computed again where it is returned), made one node: torch.fx keeps each as it is
    written, and a template reads a value once. Not for in-place calls, modules or randomness."""
    seen: dict[tuple, fx.Node] = {}
    for n in list(gm.graph.nodes):
        if n.op not in ("call_function", "call_method"):
            continue
        name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "")
        if name.endswith("_") or any(w in name for w in _IMPURE):
            continue
        key = (n.op, n.target, repr(n.args), repr(n.kwargs))
        if key in seen:
            n.replace_all_uses_with(seen[key])
            gm.graph.erase_node(n)
        else:
            seen[key] = n
    gm.recompile()


def split_nodes(gm: fx.GraphModule) -> tuple[list[fx.Node], list[fx.Node], list[fx.Node]]:
    ph = [n for n in gm.graph.nodes if n.op == "placeholder"]
    calls = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
    outs = [n for n in gm.graph.nodes if n.op == "output"]
    return ph, calls, outs


def results_of(out: fx.Node) -> list[Any]:
    r = out.args[0]
    return list(r) if isinstance(r, (tuple, list)) else [r]


def one_result(out: fx.Node, template: str) -> Any:
    """The graph's one output, for a template that writes one."""
    results = results_of(out)
    if len(results) != 1:
        names = ", ".join(r.name if isinstance(r, fx.Node) else repr(r) for r in results)
        raise Unsupported(f"a graph with {len(results)} outputs ({names}): the {template} template writes one")
    return results[0]


def param_names(spec: OpSpec, given: list, ph: list[fx.Node]) -> tuple[dict[fx.Node, str], list[str], list[str]]:
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


def launch_params(spec: OpSpec) -> list[tuple[str, str]]:
    """(name, annotation) of the launch's parameters, in kernel-contract order."""
    params = [(t.name, "cute.Tensor") for t in spec.tensors]
    params += [(s, "cutlass.Int64" if isinstance(v, int) else "cutlass.Float32") for s, v in spec.scalars.items()]
    return params


def depends_on(
    gm: fx.GraphModule, inputs: set[fx.Node], result: fx.Node | tuple[fx.Node, ...]
) -> dict[fx.Node, set[str]]:
    """What each node depends on: the inputs directly ("x"), the reductions' `result` nodes
    ("r"), or both; so the output reads as a function of the results alone, or the input
    rewritten with them (a softmax's result is already x rewritten)."""
    results = result if isinstance(result, tuple) else (result,)
    side: dict[fx.Node, set[str]] = {n: {"x"} for n in inputs}
    for n in gm.graph.nodes:
        if n in results:
            side[n] = {"x", "r"} if op_of(gm, n).kind in NORMALIZERS else {"r"}
        elif n.op in ("call_function", "call_method", "call_module"):
            side[n] = set().union(*(side.get(a, set()) for a in n.all_input_nodes))
    return side


def only_module(gm: fx.GraphModule, inputs: int) -> tuple[list[fx.Node], nn.Module] | None:
    """The graph's placeholders and its one module, when the graph is that module called on its
    `inputs` inputs and returning its result."""
    ph, calls, (out,) = split_nodes(gm)
    if len(calls) != 1 or calls[0].op != "call_module" or results_of(out) != [calls[0]] or len(ph) != inputs:
        return None
    if list(calls[0].args[:inputs]) != ph:
        return None
    return ph, gm.get_submodule(str(calls[0].target))


def kind_of(gm: fx.GraphModule, n: fx.Node) -> str | None:
    """A call's kind; None for a node that is no call, or a call no template knows (the matchers
    that read it name it)."""
    if n.op not in ("call_function", "call_method", "call_module"):
        return None
    try:
        return op_of(gm, n).kind
    except Unsupported:
        return None


def under_views(gm: fx.GraphModule, node: Any) -> tuple[Any, list[fx.Node]]:
    """The value `node` is a view of through views alone (a result reshaped on its way out: the
    same memory), and those views, outermost first."""
    views = []
    while isinstance(node, fx.Node) and kind_of(gm, node) in VIEWS and node.args and isinstance(node.args[0], fx.Node):
        views.append(node)
        node = node.args[0]
    return node, views


def describe(gm: fx.GraphModule, n: fx.Node) -> str:
    try:
        return op_of(gm, n).kind
    except Unsupported as e:
        return str(e)
