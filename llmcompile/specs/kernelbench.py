"""Custom ops from KernelBench-format problem files, loaded into the same OpSpec as built-ins.

A problem file defines `class Model(nn.Module)`, `get_inputs()` and `get_init_inputs()`.
The spec's tensors, in kernel-contract order: the forward inputs, then the model's
parameters (by name, so a norm's weight reaches the kernel), then the outputs. The leading
dim of the first input is the symbolic M; a tensor whose leading dim equals it is batched
with it, every other dim is fixed. The byte model is every tensor read or written once. Python numbers among the forward inputs
(a scale, a dim) become the op's scalars, passed after the tensors; bool masks and int32/int64
indices are tensors like any other.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib.util
import operator
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.overrides import TorchFunctionMode

from llmcompile.specs import DEFAULT_TOL, OpError, OpSpec, TensorDesc, Tolerance, dtype_name

# A sum over a whole row in fp32 rounds at ~1e-5 relative; bf16/fp16 as for built-ins.
CUSTOM_TOL = {**DEFAULT_TOL, "float32": Tolerance(1e-4, 1e-4)}
_CACHE: dict[tuple[str, str], OpSpec] = {}


def _import(path: Path):
    name = "llmcompile_problem_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise OpError(f"{path}: not a Python file")
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except Exception as e:
        raise OpError(f"{path}: importing the problem failed: {type(e).__name__}: {e}") from None
    for attr in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(mod, attr):
            raise OpError(
                f"{path}: a KernelBench problem defines Model, get_inputs and get_init_inputs; {attr} missing"
            )
    if not (isinstance(mod.Model, type) and issubclass(mod.Model, nn.Module)):
        raise OpError(f"{path}: Model must be a torch.nn.Module subclass")
    return mod


def _as_list(out: object, what: str, path: Path, numbers: bool = False) -> list:
    """The items of a problem's inputs or results: tensors (and, for inputs, Python numbers)."""
    items = list(out) if isinstance(out, (tuple, list)) else [out]
    ok = (torch.Tensor, int, float, bool) if numbers else (torch.Tensor,)
    if not items or not all(isinstance(t, ok) for t in items) or not isinstance(items[0], torch.Tensor):
        kinds = "tensors (the first one a tensor) or Python numbers" if numbers else "tensors"
        raise OpError(f"{path}: {what} must be {kinds} (got {[type(t).__name__ for t in items]})")
    return items


_NARROW_CASTS = (torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16)


class Float64Casts(TorchFunctionMode):
    """The float64 reference's casts: one from float64 to another floating dtype keeps float64
    (`x.float()`, `.to(torch.bfloat16)`, `.type(torch.float32)`). The reference is the model's
    arithmetic unrounded, so a step a model computes in fp32 is exact there too, and it meets the
    float64 parameters it is run with (an fp32 LayerNorm input beside them raised). A product
    (`torch.prod`) that is inf or NaN there is taken again as `exact_product` takes it."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = dict(kwargs or {})
        t = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if t is not None and t.dtype == torch.float64:
            if func in _NARROW_CASTS:
                return t
            if func in (torch.prod, torch.Tensor.prod) and kwargs.get("dtype", torch.float64).is_floating_point:
                out = func(*args, **kwargs)
                if bool(torch.isfinite(out).all()):
                    return out
                dim = args[1] if len(args) > 1 else kwargs.get("dim")
                exact = exact_product(t, dim, bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False)))
                return torch.where(torch.isfinite(out), out, exact)
            if func in (torch.Tensor.to, torch.Tensor.type):
                args = tuple(_wide(a) for a in args)
                kwargs = {k: _wide(v) for k, v in kwargs.items()}
        return func(*args, **kwargs)


def exact_product(x: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """x's product (over `dim`, or whole) as float64 holds the exact one: the magnitude as a sum
    of logs, the sign by counting, and zeros, infinities and NaN as a product meets them. A plain
    float64 product of millions of elements leaves float64's range part way (a whole tensor of 2M
    values with a few spikes: partial products of inf beside partials of 0, and NaN as their
    product where the product is 0), and an fp32 kernel that gets it right was judged wrong. Its
    magnitude is as exact as a float64 sum of logs: Float64Casts takes it only where the plain
    product is not finite."""
    if dim is None:
        x, dim = x.reshape(-1), 0
    zero, inf = (x == 0).any(dim, keepdim), torch.isinf(x).any(dim, keepdim)
    finite = torch.isfinite(x) & (x != 0)
    logs = torch.where(finite, x.abs().log(), torch.zeros((), dtype=x.dtype, device=x.device))
    negative = (x < 0).sum(dim, keepdim) % 2 == 1
    mag = torch.where(inf, torch.inf, torch.where(zero, 0.0, logs.sum(dim, keepdim).exp()))
    out = torch.where(negative, -mag, mag)
    return torch.where(torch.isnan(x).any(dim, keepdim) | (zero & inf), torch.nan, out)


def _wide(a: object) -> object:
    """A floating dtype as float64 (another argument as it is)."""
    return torch.float64 if isinstance(a, torch.dtype) and a.is_floating_point else a


_TENSOR_DTYPES = {torch.int64: "int64", torch.int32: "int32", torch.bool: "bool"}


# Module-level names a problem file sizes its batch with (KernelBench's own conventions).
BATCH_NAMES = ("batch_size", "M", "B", "batch")


def _batched_inputs(mod, m: int, m0: int, path: Path, device: str | None = None) -> list:
    """`get_inputs()` at batch M: through the file's own batch variable where setting it changes
    the leading dim and nothing else (so a 17 GB problem is never made whole to verify a few
    rows), else made whole and sliced: on `device` where it has room for them (`_room`), else on
    the CPU. `device`: where its tensors are made (KernelBench's files make them on the CPU, at
    several seconds a GB: a GPU makes them in milliseconds; a file that spells its shapes out
    cost a whole-tensor std's verify 57 s of CPU-made inputs, on an H200's host)."""
    on = torch.device(device) if device else contextlib.nullcontext()
    if m == m0:
        with on:
            return _as_list(mod.get_inputs(), "get_inputs()", path, numbers=True)
    with torch.device("meta"):
        whole = _as_list(mod.get_inputs(), "get_inputs()", path, numbers=True)
    want = [(x.shape[0] == m0, x.shape[1:], x.dtype) for x in whole if isinstance(x, torch.Tensor)]
    for name in BATCH_NAMES:
        if getattr(mod, name, None) != m0 or isinstance(getattr(mod, name), bool):
            continue
        setattr(mod, name, m)
        try:
            with on:
                xs = _as_list(mod.get_inputs(), "get_inputs()", path, numbers=True)
        finally:
            setattr(mod, name, m0)
        got = [(x.shape[0] == m, x.shape[1:], x.dtype) for x in xs if isinstance(x, torch.Tensor)]
        if got == want:
            return xs
    with on if _room(whole, device) else contextlib.nullcontext():
        xs = _as_list(mod.get_inputs(), "get_inputs()", path, numbers=True)
    return [x[:m].contiguous() if isinstance(x, torch.Tensor) and x.dim() and x.shape[0] == m0 else x for x in xs]


# The whole inputs made on a GPU take this many times their bytes (a file's own temporaries:
# `torch.randn(...) * 3 + 1`, a cast after making them in fp32).
WHOLE_ROOM = 3


def _room(whole: list, device: str | None) -> bool:
    """Whether the problem's whole inputs (`whole`: on the meta device) are made on `device`, a
    GPU, rather than where the file makes them: where WHOLE_ROOM times their bytes fit what it
    could give now (its free memory and torch's cached, unused blocks: the read-only mappings
    take those back)."""
    if not device or torch.device(device).type != "cuda":
        return False
    dev = torch.device(device)
    need = WHOLE_ROOM * sum(x.numel() * x.element_size() for x in whole if isinstance(x, torch.Tensor))
    cached = torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
    return need <= torch.cuda.mem_get_info(dev)[0] + cached


def _batch_rows(model: nn.Module, mod, m0: int, outputs: list[torch.Tensor], path: Path) -> list[int] | None:
    """Whether the problem means the same thing at another batch size: run on the meta device at
    batch 2, every batched output must shrink with it. None where it does not; else each output's
    rows an item of the batch: 1 (its first dim the batch's), k (the batch's items flattened to k
    rows each: `x.view(-1, N)`'s softmax), or 0 (a shape of its own). (A loss that broadcasts its
    targets along the last dim only works at its own size.)"""
    if m0 <= 2:
        return None
    try:
        with torch.device("meta"):
            xs = _batched_inputs(mod, 2, m0, path)
        got = _output_shapes(model, xs, path, cpu_fallback=False)
    except Exception:  # noqa: BLE001 - it does not run at another size: fixed
        return None
    if len(got) != len(outputs):
        return None
    rows = []
    for o, g in zip(outputs, got):
        whole, at_two = tuple(o.shape), tuple(g.shape)
        k = whole[0] // m0 if whole and whole[0] % m0 == 0 else 0
        if k and at_two == (2 * k, *whole[1:]):
            rows.append(k)
        elif at_two == whole and not (whole and whole[0] == m0):  # (one of the batch's size must shrink)
            rows.append(0)
        else:
            return None
    return rows


# Rows of a batch of this size are run on CPU to see whether each output row depends on its
# own input rows only; past this many elements per batch the check is skipped (assumed not).
INDEPENDENCE_ELEMS = 1 << 27


def _independent_rows(model: nn.Module, mod, m0: int, outputs: list[torch.Tensor], path: Path) -> bool:
    """Whether each output row of a batch of 3 rows equals the same row computed from its own
    input row alone (on CPU): so a norm over the whole batch or tensor (a Frobenius norm, a
    batch statistic) or a scan along the batch is told from a per-row op, and its timed
    outputs are never checked in chunks of rows. (Every row: a cumsum along the batch's first
    row is its input's alone.)"""
    if m0 < 3 or not all(o.dim() and o.shape[0] == m0 for o in outputs):
        return False
    with torch.device("meta"):
        shapes = [x for x in _batched_inputs(mod, 3, m0, path) if isinstance(x, torch.Tensor)]
    if sum(x.numel() for x in shapes) > INDEPENDENCE_ELEMS:
        return False
    torch.manual_seed(1)
    xs = _batched_inputs(mod, 3, m0, path)
    try:
        with torch.no_grad():
            # compared in fp32 (a problem's outputs are fp32 or narrower): at 3 rows of 16M
            # elements a float64 copy of each costs more than the model's own runs
            whole = [w.float() for w in _as_list(model(*xs), "Model.forward's results", path)]
            scale = [float(w.abs().amax()) if w.numel() else 0.0 for w in whole]
            for i in range(3):
                one = [x[i : i + 1] if isinstance(x, torch.Tensor) and x.dim() and x.shape[0] == 3 else x for x in xs]
                alone = _as_list(model(*one), "Model.forward's results", path)
                # a row that depends on the others moves by O(1) (a norm over 3 rows, not 1), while
                # the same row computed alone rounds differently (fp32 GEMV over 1M terms: 1e-4)
                if not all(
                    a.shape == w[i : i + 1].shape
                    and torch.allclose(a.float(), w[i : i + 1], rtol=1e-3, atol=1e-3 * s, equal_nan=True)
                    for a, w, s in zip(alone, whole, scale)
                ):
                    return False
    except Exception:  # noqa: BLE001 - it does not run on one row: rows are not independent
        return False
    return True


# What keeps small integers small integers (summed, maxed, shifted, negated, multiplied, masked,
# reordered): a graph of these alone is exact on the verify stage's "integers" case in any order;
# one of the dividing ones at its end (a mean, a mean-reduced loss, a square root) makes it "divided".
_EXACT = {
    torch.sum, torch.amax, torch.amin, torch.max, torch.min, torch.cumsum, torch.cummax, torch.cummin, torch.flip, torch.cat, torch.abs,
    torch.neg, torch.relu, F.relu, torch.clamp, torch.add, torch.sub, torch.mul, torch.unsqueeze, torch.narrow,
    torch.zeros_like, torch.select, torch.square, torch.pow, operator.add, operator.sub, operator.mul,
    operator.neg, operator.pow, operator.getitem,
    "sum", "amax", "amin", "max", "min", "cumsum", "cummax", "cummin", "flip", "abs", "neg", "relu", "clamp", "clamp_min", "select",
    "unsqueeze", "view", "reshape", "contiguous", "size", "narrow", "add", "sub", "mul", "flatten", "square", "pow",
}  # fmt: skip
_DIVIDING = {torch.mean, "mean", F.mse_loss, F.l1_loss, torch.sqrt, "sqrt", operator.truediv, torch.div, "div"}


def _exactness(model: nn.Module, given: list) -> str:
    """OpSpec.exact of a problem's model: "sum" where every node keeps small integers small
    integers, "divided" where one dividing node ends it, else "" (or where it does not trace, or
    takes a fractional scalar: x * 3.14 rounds, in float64 and in fp32 differently)."""
    if any(isinstance(g, float) and not float(g).is_integer() for g in given):
        return ""
    try:
        gm = fx.symbolic_trace(model)
    except Exception:  # noqa: BLE001 - data-dependent control flow: not known to be exact
        return ""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    dividing = []
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method"):
            if node.op == "call_module":
                return ""
            continue
        consts = [a for a in node.args[1:] if isinstance(a, (int, float)) and not isinstance(a, bool)]
        if any(float(c) != int(c) for c in consts if isinstance(c, float)):
            return ""  # a fractional constant: not an integer any more
        if node.target in _DIVIDING:
            dividing.append(node)
        elif node.target not in _EXACT:
            return ""
    if not dividing:
        return "sum"
    results = out.args[0] if isinstance(out.args[0], (tuple, list)) else [out.args[0]]
    return "divided" if len(dividing) == 1 and dividing[0] in results else ""


def _output_shapes(model: nn.Module, inputs: list, path: Path, cpu_fallback: bool = True) -> list[torch.Tensor]:
    """The outputs' shapes and dtypes, from a run on the meta device; on CPU where an op has
    no meta kernel."""
    with torch.no_grad():
        try:
            meta = copy.deepcopy(model).to("meta")
            return _as_list(meta(*inputs), "Model.forward's results", path)
        except OpError:
            raise
        except Exception:  # noqa: BLE001 - fall back to a real run on CPU
            if not cpu_fallback:
                raise
            real = [torch.zeros(x.shape, dtype=x.dtype) if isinstance(x, torch.Tensor) else x for x in inputs]
            return _as_list(model(*real), "Model.forward's results", path)


def load_problem(path: str | Path, independent_rows: bool | None = None) -> OpSpec:
    """A KernelBench-format file as an OpSpec. `independent_rows`: what another process found
    for this file already (the judge, for its GPU worker), so the check's seconds on CPU are not
    paid twice."""
    path = Path(path)
    if not path.is_file():
        raise OpError(f"no such problem file: {path}")
    key = (str(path.resolve()), hashlib.sha256(path.read_bytes()).hexdigest())
    if key in _CACHE:
        return _CACHE[key]
    mod = _import(path)
    with torch.random.fork_rng(devices=[]):
        try:
            model, given = _instantiate(mod, path)
            outputs = _output_shapes(model, given, path)
        except OpError:
            raise
        except Exception as e:
            raise OpError(f"{path}: running the problem on CPU failed: {type(e).__name__}: {e}") from None
    params = dict(model.named_parameters())
    # forward's arguments in order: ("t", index among the tensors) or ("s", the scalar's name)
    order: list[tuple[str, int | str]] = []
    for k, x in enumerate(given):
        order.append(("t", sum(kind == "t" for kind, _ in order)) if isinstance(x, torch.Tensor) else ("s", f"arg{k}"))
    scalars = {f"arg{k}": x for k, x in enumerate(given) if not isinstance(x, torch.Tensor)}
    scalars = {k: int(v) if isinstance(v, bool) else v for k, v in scalars.items()}
    inputs = [x for x in given if isinstance(x, torch.Tensor)]
    if inputs[0].dim() < 1 or not inputs[0].is_floating_point():
        raise OpError(f"{path}: the first input must be a floating tensor with a leading batch dim")
    m0 = inputs[0].shape[0]
    n = inputs[0].shape[-1]
    dtype = dtype_name(inputs[0].dtype)

    batch_rows = _batch_rows(model, mod, m0, outputs, path)
    batchable = batch_rows is not None

    def desc(name: str, t: torch.Tensor, batched: bool, output: bool = False, k: int = 0) -> TensorDesc:
        def first(s: int) -> str:
            return "M" if s == m0 else f"M*{k}" if k > 1 and s == k * m0 else str(s)

        dims = tuple(first(s) if i == 0 and batched else str(s) for i, s in enumerate(t.shape))
        return TensorDesc(name, dims, dtype_name(t.dtype) if t.is_floating_point() else _TENSOR_DTYPES[t.dtype], output)

    for t in inputs + outputs:
        if not t.is_floating_point() and t.dtype not in _TENSOR_DTYPES:
            raise OpError(f"{path}: tensors must be float32/bfloat16/float16, int64, int32 or bool; got {t.dtype}")
    tensors = (
        tuple(desc(f"in{i}", t, True) for i, t in enumerate(inputs))
        + tuple(desc(k.replace(".", "_"), p, False) for k, p in params.items())
        + tuple(
            desc(f"out{i}" if len(outputs) > 1 else "out", t, True, True, batch_rows[i] if batch_rows else 0)
            for i, t in enumerate(outputs)
        )
    )
    n_in = len(inputs)
    names = list(params)

    def forward_args(xs: tuple, vals: dict) -> tuple:
        return tuple(xs[key] if kind == "t" else vals[key] for kind, key in order)

    # The model on each (device, dtype) it is run in, each a copy: `.to()` converts a module in
    # place, and a float64 reference must not turn the parameters make_inputs copies (or a
    # BatchNorm's running buffers) to float64 for every later call.
    models: dict[tuple[str, torch.dtype | None], nn.Module] = {}

    def model_on(device: torch.device, dtype: torch.dtype | None) -> nn.Module:
        key = (str(device), dtype)
        if key not in models:
            models[key] = copy.deepcopy(model).to(device, dtype)
        return models[key]

    def call(*xs: torch.Tensor, **vals: float | int) -> list[torch.Tensor]:
        wide = xs[0].dtype == torch.float64
        with torch.no_grad(), Float64Casts() if wide else contextlib.nullcontext():
            mdl = model_on(xs[0].device, torch.float64 if wide else None)
            out = torch.func.functional_call(mdl, dict(zip(names, xs[n_in:])), forward_args(xs, {**scalars, **vals}))
        return list(out) if isinstance(out, (tuple, list)) else [out]

    def torch_fn(*args: object) -> object:
        """The problem in torch: its tensors in spec order, then its scalars' values."""
        xs, vals = args[: n_in + len(names)], dict(zip(scalars, args[n_in + len(names) :]))
        with torch.no_grad():
            mdl = model_on(xs[0].device, None)
            return torch.func.functional_call(mdl, dict(zip(names, xs[n_in:])), forward_args(xs, {**scalars, **vals}))

    def make_inputs(m: int, n_: int, dtype_: str, gen: torch.Generator, case: str, device: str) -> list[torch.Tensor]:
        if m > m0:
            raise OpError(f"{path.name}: M={m} is larger than the problem's batch {m0}")
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen, device=gen.device))
        dev = torch.device(device)
        with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
            torch.manual_seed(seed)
            xs = [x for x in _batched_inputs(mod, m, m0, path, device) if isinstance(x, torch.Tensor)]
            # fresh parameter values, so a kernel that assumes the init (ones, zeros) fails
            ps = [
                (torch.rand(p.shape, device=dev) + 0.5).to(p.dtype) if p.is_floating_point() else p.detach().clone()
                for p in params.values()
            ]
        return [t.detach().to(device) for t in xs + ps]

    doc = (mod.__doc__ or "").strip().splitlines()
    spec = OpSpec(
        name=path.stem,
        summary=doc[0] if doc else f"KernelBench problem {path.name}",
        tensors=tensors,
        reference=call,
        make_inputs=make_inputs,
        scalars=scalars,
        tolerance=dict(CUSTOM_TOL),
        dtypes=(dtype,),
        torch_expr=path.read_text(),
        torch_fn=torch_fn,
        fixed_shapes=((m0, n),),
        batchable=batchable,
        independent_rows=batchable
        and (independent_rows if independent_rows is not None else _independent_rows(model, mod, m0, outputs, path)),
        exact=_exactness(model, given),
        source_path=str(path.resolve()),
    )
    _CACHE[key] = spec
    sys.modules.setdefault(mod.__name__, mod)
    return spec


def load_dir(directory: str | Path) -> tuple[list[OpSpec], dict[str, str]]:
    """Every problem file of a directory: the specs that load, and why each other one did not."""
    d = Path(directory)
    if not d.is_dir():
        raise OpError(f"no such problem directory: {d}")
    specs, errors = [], {}
    for p in sorted(d.glob("*.py")):
        if p.name.startswith("_"):
            continue
        try:
            specs.append(load_problem(p))
        except OpError as e:
            errors[p.name] = str(e)
    return specs, errors


def _instantiate(mod, path: Path) -> tuple[nn.Module, list]:
    """The problem's model as its file builds it (seeded, and left in training mode, as
    KernelBench runs it: a BatchNorm normalizes with its batch's statistics) and its forward
    arguments at full size on the meta device: shapes and dtypes only, no time, no memory."""
    torch.manual_seed(0)
    model = mod.Model(*mod.get_init_inputs())
    with torch.device("meta"):
        given = _as_list(mod.get_inputs(), "get_inputs()", path, numbers=True)
    return model, given


def model_of(spec: OpSpec) -> tuple[nn.Module, list]:
    """What the pattern matcher traces: the problem's model, moved to the meta device, and its
    forward arguments at full size there."""
    if not spec.source_path:
        raise OpError(f"{spec.name} is not a KernelBench problem")
    path = Path(spec.source_path)
    with torch.random.fork_rng(devices=[]):
        model, given = _instantiate(_import(path), path)
    return model.to("meta"), given
