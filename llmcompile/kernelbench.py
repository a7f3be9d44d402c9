"""Custom ops from KernelBench-format problem files, loaded into the same OpSpec as built-ins.

A problem file defines `class Model(nn.Module)`, `get_inputs()` and `get_init_inputs()`.
The spec's tensors, in kernel-contract order: the forward inputs, then the model's
parameters (by name, so a norm's weight reaches the kernel), then the outputs. The leading
dim of the first input is the symbolic M; a tensor whose leading dim equals it is batched
with it, every other dim is fixed. The byte model is every tensor read or written once.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import sys
from pathlib import Path

import torch
from torch import nn

from llmcompile.ops import DEFAULT_TOL, OpError, OpSpec, TensorDesc, Tolerance, dtype_name

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


def _as_list(out: object, what: str, path: Path) -> list[torch.Tensor]:
    items = list(out) if isinstance(out, (tuple, list)) else [out]
    if not items or not all(isinstance(t, torch.Tensor) for t in items):
        raise OpError(f"{path}: {what} must be tensors (got {[type(t).__name__ for t in items]})")
    return items


def _output_shapes(model: nn.Module, inputs: list[torch.Tensor], path: Path) -> list[torch.Tensor]:
    """The outputs' shapes and dtypes, from a run on the meta device; on CPU where an op has
    no meta kernel."""
    with torch.no_grad():
        try:
            meta = copy.deepcopy(model).to("meta")
            return _as_list(meta(*inputs), "Model.forward's results", path)
        except OpError:
            raise
        except Exception:  # noqa: BLE001 - fall back to a real run on CPU
            real = [torch.zeros(x.shape, dtype=x.dtype) for x in inputs]
            return _as_list(model(*real), "Model.forward's results", path)


def load_problem(path: str | Path) -> OpSpec:
    path = Path(path)
    if not path.is_file():
        raise OpError(f"no such problem file: {path}")
    key = (str(path.resolve()), hashlib.sha256(path.read_bytes()).hexdigest())
    if key in _CACHE:
        return _CACHE[key]
    mod = _import(path)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        try:
            model = mod.Model(*mod.get_init_inputs()).eval()
            with torch.device("meta"):  # shapes and dtypes only: no time, no memory
                inputs = _as_list(mod.get_inputs(), "get_inputs()", path)
            outputs = _output_shapes(model, inputs, path)
        except OpError:
            raise
        except Exception as e:
            raise OpError(f"{path}: running the problem on CPU failed: {type(e).__name__}: {e}") from None
    params = dict(model.named_parameters())
    if inputs[0].dim() < 1 or not inputs[0].is_floating_point():
        raise OpError(f"{path}: the first input must be a floating tensor with a leading batch dim")
    m0 = inputs[0].shape[0]
    n = inputs[0].shape[-1]
    dtype = dtype_name(inputs[0].dtype)

    def desc(name: str, t: torch.Tensor, batched: bool, output: bool = False) -> TensorDesc:
        dims = tuple("M" if (i == 0 and batched and s == m0) else str(s) for i, s in enumerate(t.shape))
        return TensorDesc(name, dims, dtype_name(t.dtype) if t.is_floating_point() else "int64", output)

    for t in inputs + outputs:
        if not t.is_floating_point() and t.dtype != torch.int64:
            raise OpError(f"{path}: tensors must be float32/bfloat16/float16 or int64, got {t.dtype}")
    tensors = (
        tuple(desc(f"in{i}", t, True) for i, t in enumerate(inputs))
        + tuple(desc(k.replace(".", "_"), p, False) for k, p in params.items())
        + tuple(desc(f"out{i}" if len(outputs) > 1 else "out", t, True, output=True) for i, t in enumerate(outputs))
    )
    n_in = len(inputs)
    names = list(params)

    def call(*xs: torch.Tensor) -> list[torch.Tensor]:
        with torch.no_grad():
            mdl = model.to(xs[0].device, torch.float64 if xs[0].dtype == torch.float64 else None)
            out = torch.func.functional_call(mdl, dict(zip(names, xs[n_in:])), tuple(xs[:n_in]))
        return list(out) if isinstance(out, (tuple, list)) else [out]

    def torch_fn(*xs: torch.Tensor) -> object:
        with torch.no_grad():
            return torch.func.functional_call(model.to(xs[0].device), dict(zip(names, xs[n_in:])), tuple(xs[:n_in]))

    def make_inputs(m: int, n_: int, dtype_: str, gen: torch.Generator, case: str, device: str) -> list[torch.Tensor]:
        if m > m0:
            raise OpError(f"{path.name}: M={m} is larger than the problem's batch {m0}")
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            xs = _as_list(mod.get_inputs(), "get_inputs()", path)
            # fresh parameter values, so a kernel that assumes the init (ones, zeros) fails
            ps = [
                (torch.rand(p.shape) + 0.5).to(p.dtype) if p.is_floating_point() else p.detach().clone()
                for p in params.values()
            ]
        xs = [x[:m].contiguous() if x.dim() and x.shape[0] == m0 else x for x in xs]
        return [t.detach().to(device) for t in xs + ps]

    doc = (mod.__doc__ or "").strip().splitlines()
    spec = OpSpec(
        name=path.stem,
        summary=doc[0] if doc else f"KernelBench problem {path.name}",
        tensors=tensors,
        reference=call,
        make_inputs=make_inputs,
        tolerance=dict(CUSTOM_TOL),
        dtypes=(dtype,),
        torch_expr=path.read_text(),
        torch_fn=torch_fn,
        fixed_shapes=((m0, n),),
        source_path=str(path.resolve()),
    )
    _CACHE[key] = spec
    sys.modules.setdefault(mod.__name__, mod)
    return spec


def load_dir(directory: str | Path) -> list[OpSpec]:
    d = Path(directory)
    if not d.is_dir():
        raise OpError(f"no such problem directory: {d}")
    return [load_problem(p) for p in sorted(d.glob("*.py")) if not p.name.startswith("_")]
