"""The torch-facing call of a compiled kernel: `KernelFunction`, what `llmcompile.kernels.softmax`
and a loaded artifact are.

At small sizes the host time of a call, not bandwidth, decides the speed, so a call does as
little Python as it can: everything that depends only on (dtype, N) is decided once, in a
`_Plan`. A call on rows (a 2-D x) of a planned (dtype, N) starts and ends in C (`native_call`'s
Entry and Caller: the plan found by x's dtype and N, the inputs seen as DLTensors, the outputs
allocated by torch's allocator, the kernel's TVM-FFI function called on the current stream),
with no Python at all; where no C compiler built that, the Python `__call__` finds the plan and
makes the outputs from Python. The kernel's own checks, in C, refuse what does not fit (dtypes,
shapes, strides, alignment) before the launch; a refused call is taken again on the checked
path: full validation with clear errors, and copies where an input is not contiguous or
aligned. Leading dims cost a view each way. Under torch.compile a call is traced (through the
Python `__call__`) into the torch.library op, which has a fake implementation.

This module imports torch only: a loaded artifact runs without CuTe DSL.
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from llmcompile.runtime import native_call
from llmcompile.specs import DTYPES, MAX_ELEMS, HasTensors, OpError, OpSpec, TensorDesc, dtype_name
from llmcompile.specs.contract import WithWorkspace

_LIB = torch.library.Library("llmcompile", "FRAGMENT")
_is_grad_enabled, _is_compiling = torch.is_grad_enabled, torch.compiler.is_compiling
_ALIGN = 16
MAX_GIVEN = 64  # fast calls kept for scalars given by keyword, across (dtype, N, values)
# An attention's v read where it lies ((B, H, N, D) strided, `strided_v_call`) rather than copied
# dense, and o written as the backward's kernel reads it; LLMCOMPILE_STRIDED_V=0 copies v and writes
# o dense (the comparison in evals/results/host-time)
STRIDED_V = os.environ.get("LLMCOMPILE_STRIDED_V", "1") != "0"
MAX_LEAD_DIMS = 4  # leading dims a Python-side lookup finds the C call for (in C: any)


@dataclass(frozen=True)
class CallSpec(HasTensors):
    """What calling a kernel needs to know of its op: its tensors (inputs, then outputs), its
    scalars with their defaults, and the dtypes it takes. Built from an OpSpec, or from an
    artifact's manifest where no OpSpec exists (a loader without the problem's file)."""

    name: str
    tensors: tuple[TensorDesc, ...]
    scalars: dict[str, float | int]
    dtypes: tuple[str, ...]

    @classmethod
    def of(cls, spec: OpSpec) -> CallSpec:
        return cls(spec.name, spec.tensors, dict(spec.scalars), tuple(spec.dtypes))

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "tensors": [[t.name, list(t.dims), t.dtype, t.output] for t in self.tensors],
            "scalars": self.scalars,
            "dtypes": list(self.dtypes),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CallSpec:
        tensors = tuple(TensorDesc(name, tuple(dims), dt, bool(out)) for name, dims, dt, out in d["tensors"])
        return cls(d["name"], tensors, dict(d["scalars"]), tuple(d["dtypes"]))


def _schema(spec: CallSpec) -> str:
    parts = [f"Tensor {t.name}" for t in spec.inputs]
    parts += [f"Tensor(a{i}!) {t.name}" for i, t in enumerate(spec.outputs)]
    parts += [f"{'int' if isinstance(v, int) else 'float'} {k}" for k, v in spec.scalars.items()]
    return f"({', '.join(parts)}) -> ()"


@dataclass(frozen=True)
class _Plan:
    """A flat-rows op at one (dtype, N): what a fast call needs, decided once."""

    fn: Any  # the TVM-FFI function itself, no Python wrapper around it (but a workspace's)
    n: int
    rest: tuple[tuple[str, torch.dtype], ...]  # inputs after x: ("MN" | "M" | "N" | "fixed", dtype)
    outs: tuple[tuple[str, torch.dtype], ...]  # "like" (x's shape and dtype) | "MN" | "M" | "N" | "one"
    values: tuple[float | int, ...]  # the scalars' defaults, in order
    alloc: Callable[[tuple[torch.Tensor, ...]], Any]  # the outputs from the inputs: one tensor, or a tuple
    arity: int  # inputs a call takes
    one: bool  # one output: alloc makes a tensor, not a tuple
    dtype: torch.dtype  # x's


def _maker(kind: str, dt: torch.dtype, like: dict[str, int]) -> Callable[[tuple[torch.Tensor, ...]], torch.Tensor]:
    """One output made the cheapest way torch has: like an input of its shape (torch.empty_like
    costs 1.8 us of host time on the H100 machine, torch.empty(shape, dtype=, device=) 3.4)."""
    empty_like = torch.empty_like
    if kind == "like":
        return lambda ins: empty_like(ins[0])
    if kind == "MN":
        return lambda ins: empty_like(ins[0], dtype=dt)
    if kind == "one":
        return lambda ins: ins[0].new_empty((1,), dtype=dt)
    if kind in like:
        i = like[kind]
        return lambda ins: empty_like(ins[i], dtype=dt)
    axis = 0 if kind == "M" else 1
    return lambda ins: ins[0].new_empty((ins[0].shape[axis],), dtype=dt)


def _allocator(
    rest: tuple[tuple[str, torch.dtype], ...], outs: tuple[tuple[str, torch.dtype], ...]
) -> Callable[[tuple[torch.Tensor, ...]], Any]:
    like: dict[str, int] = {}  # an input of shape (M,) or (N,), which an output of that shape is made like
    for i, (kind, _) in enumerate(rest):
        like.setdefault(kind, i + 1)
    makers = [_maker(kind, dt, like) for kind, dt in outs]
    if len(makers) == 1:
        return makers[0]
    return lambda ins: tuple(mk(ins) for mk in makers)


def _dense(t: torch.Tensor) -> bool:
    """Laid out as a compiled kernel reads a tensor: contiguous, 16-byte aligned."""
    return t.is_contiguous() and not t.data_ptr() % _ALIGN


class _NotFast(Exception):
    """A call the fast function does not take (no rows, too many elements, a wrong count)."""


def bare_function(fn: Any) -> Any:
    """The TVM-FFI function a compiled kernel wraps: CuTe DSL wraps a function with defaults in
    Python (0.4 us a call); anything else is returned as it is."""
    return getattr(fn, "__tvm_ffi_object__", lambda: fn)()


def _native_function(plan: _Plan) -> Callable[..., Any] | None:
    """The whole fast call in C (`native_call`): the outputs allocated there, not from Python
    (torch.empty_like costs 1.9-4 us of host time on the H100 machine). None where it cannot be built here, or
    where the kernel is not a TVM-FFI function (a Python wrapper would gain nothing)."""
    fn, bound = plan.fn, ()
    if isinstance(fn, WithWorkspace):  # the workspace its first checked call made, bound to the caller
        if len(fn.buffers) != 1:
            return None
        fn, bound = bare_function(fn.fn), tuple(fn.buffers.values())
    if not native_call.is_function(fn) or not native_call.available():
        return None
    dims = {"M": "first", "N": "last", "one": "one"}
    outs = [native_call.OutputSpec(0, dims.get(kind, "all"), str(dt).removeprefix("torch.")) for kind, dt in plan.outs]
    flat = ("rows", *({"MN": "rows", "M": "values"}.get(kind, "none") for kind, _ in plan.rest))
    dtypes = tuple(str(dt).removeprefix("torch.") for dt in (plan.dtype, *(d for _, d in plan.rest)))
    try:
        return native_call.make_caller(fn, plan.arity, outs, plan.values, bound, flat, dtypes)
    except (OSError, TypeError, ValueError):  # a dtype or scalar TVM-FFI cannot carry: Python allocates
        return None


def _fixed_caller(fn: Any, ins: list, outs: list, values: tuple) -> Any | None:
    """A fixed-layout op's call in C (`native_call`): its outputs made there (two torch.empty from
    Python and TVM-FFI's conversions cost the attention's call about 10 us of host on an H200),
    each output of an input's shape or of all but its last dim (attention's o and lse). None
    where it cannot be built here, or an output is of another shape."""
    if not native_call.is_function(fn) or not native_call.available():
        return None
    specs = []
    for shape, dt in outs:
        src = next(
            ((i, k) for i, (s, _) in enumerate(ins) for k, like in (("all", s), ("lead", s[:-1])) if like == shape),
            None,
        )
        if src is None:
            return None
        specs.append(native_call.OutputSpec(*src, str(dt).removeprefix("torch.")))
    dtypes = tuple(str(dt).removeprefix("torch.") for _, dt in ins)
    try:
        return native_call.make_caller(fn, len(ins), specs, values, (), ("none",) * len(ins), dtypes)
    except (OSError, TypeError, ValueError):
        return None


def _fast_of(plan: _Plan) -> Callable[..., Any] | None:
    """The plan's fast call: in C where it can be built (it checks that every tensor is on x's
    device), else the Python one, which checks no device: on one GPU only (on a host of several,
    None: `_rows_call` checks each tensor's device)."""
    return _native_function(plan) or (_fast_function(plan) if torch.cuda.device_count() <= 1 else None)


def _fast_function(plan: _Plan) -> Callable[..., Any]:
    """The whole fast call of one plan as one small function, specialised where it pays (one input
    and one output of x's shape: softmax), so a call runs as few Python lines as possible."""
    fn, values, alloc, arity, limit = plan.fn, plan.values, plan.alloc, plan.arity, MAX_ELEMS
    empty_like = torch.empty_like
    if arity == 1 and plan.one and plan.outs[0][0] == "like" and not values:

        def rows_like(*ins: torch.Tensor) -> torch.Tensor:
            x = ins[0]
            if len(ins) != 1 or not 0 < x.numel() < limit:
                raise _NotFast
            out = empty_like(x)
            fn(x, out)
            return out

        return rows_like
    if plan.one:

        def rows_one(*ins: torch.Tensor) -> torch.Tensor:
            if len(ins) != arity or not 0 < ins[0].numel() < limit:
                raise _NotFast
            out = alloc(ins)
            fn(*ins, out, *values)
            return out

        return rows_one

    def rows_many(*ins: torch.Tensor) -> list[torch.Tensor]:
        if len(ins) != arity or not 0 < ins[0].numel() < limit:
            raise _NotFast
        outs = alloc(ins)
        fn(*ins, *outs, *values)
        return list(outs)

    return rows_many


def _shaped(
    outs: list[torch.Tensor], lead: torch.Size, rows: tuple[bool, ...] | None = None
) -> torch.Tensor | list[torch.Tensor]:
    """Flat-rows outputs given back the caller's leading dims; `rows[i]` False keeps output i
    as it is (a sum over the rows, as a norm backward's dw of shape (N,))."""
    shaped = [
        o if rows is not None and not rows[i] else o.reshape(*lead, *o.shape[1:]) if o.dim() == 2 else o.reshape(lead)
        for i, o in enumerate(outs)
    ]
    return shaped[0] if len(shaped) == 1 else shaped


def _kind(t: TensorDesc) -> str | None:
    if all(d.isdigit() for d in t.dims):
        return "fixed"  # a shape of its own, as a cross-entropy's upstream scale (1,)
    return {("M", "N"): "MN", ("M",): "M", ("N",): "N"}.get(t.dims)


class KernelFunction(native_call.entry_base()):  # type: ignore[misc]
    """A compiled kernel (one per (dtype, N)) made callable on torch tensors, for one op.

    `compile(dtype, n)` makes a missing kernel (None: only `precompiled` ones exist, as in a
    loaded artifact). With `op_name` it is also the torch.library op `torch.ops.llmcompile.<op_name>`,
    which torch.compile calls as one opaque kernel.

    Where `native_call` builds, a call starts in C (its `Entry`): on rows of a planned (dtype, N)
    that plan's `Caller` runs with no Python at all; anything else comes here, to `__call__`,
    which is also what torch.compile traces."""

    def __init__(
        self,
        spec: CallSpec | OpSpec,
        compile: Callable[[str, int], Any] | None = None,
        op_name: str | None = None,
        precompiled: dict[tuple[str, int], Any] | None = None,
        compile_strided: Callable[[str, int], Any] | None = None,
    ) -> None:
        self.spec = spec if isinstance(spec, CallSpec) else CallSpec.of(spec)
        self.compiler = compile
        # the kernel compiled for x's rows at a run-time stride (a slice of wider rows), per (dtype, N):
        # None where it cannot be made (then such rows are copied dense first)
        self.strided_compiler = compile_strided
        self._strided: dict[tuple[str, int], Any] = {}
        # an attention's strided-v kernel (bare) per (dtype, q's shape, v's shape and strides), or
        # False where that layout cannot take it: `strided_v_call`
        self._strided_v: dict[tuple[Any, ...], Any] = {}
        # the same op compiled with its (N,) tensors (weight, bias, their gradients) in fp32 beside
        # 16-bit rows, as mixed-precision training keeps weights (compiled.py sets it)
        self.vectors32: KernelFunction | None = None
        self._compiled: dict[tuple[str, int], Any] = dict(precompiled or {})
        self._plans: dict[tuple[torch.dtype, int], _Plan] = {}
        self._unplanned: set[tuple[torch.dtype, int]] = set()  # (dtype, N) decided: no plan
        # a fixed-layout op's (attention's) shapes and kernel per (dtype, M, N): `_fixed_call`
        self._fixed: dict[tuple[torch.dtype, int, int], list[Any]] = {}
        self._fast: dict[tuple[torch.dtype, int, int], Callable[..., Any]] = {}
        # fast calls with scalars given by keyword, by (dtype, N, dims, the scalars' values)
        self._fast_given: dict[tuple[Any, ...], Callable[..., Any]] = {}
        self._lock = threading.Lock()
        self.op_name = op_name
        # which outputs have rows (M first): the others keep their shape whatever x's leading dims
        self._row_outputs = tuple(t.dims[:1] == ("M",) for t in self.spec.outputs)
        # where N is in the first tensor (attention's (M, N, D): not last); -1 where it is not named
        dims = self.spec.tensors[0].dims
        self._n_axis = dims.index("N") - len(dims) if "N" in dims else -1
        self.grad_fn = None
        if op_name is not None:
            _LIB.define(f"{op_name}{_schema(self.spec)}")
            _LIB.impl(op_name, self._launch, "CUDA")
            # the op writes its outputs in place and returns nothing: that is its fake too
            torch.library.register_fake(f"llmcompile::{op_name}", lib=_LIB)(lambda *a, **k: None)

    @property
    def grad_fn(self) -> Callable[..., Any] | None:
        """The differentiable call (llmcompile.runtime.autograd), taken where an input requires grad."""
        return self._grad_fn

    @grad_fn.setter
    def grad_fn(self, fn: Callable[..., Any] | None) -> None:
        self._grad_fn = fn
        self._grad = fn is not None  # (where native_call builds, a field of its Entry: its C call reads it)

    def compiled(self, dtype: str, n: int) -> Any:
        key = (dtype, n)
        with self._lock:
            if key not in self._compiled:
                if self.compiler is None:
                    have = ", ".join(f"{d} N={k}" for d, k in sorted(self._compiled))
                    raise OpError(f"{self.spec.name}: this artifact has kernels for {have}, not {dtype} N={n}")
                self._compiled[key] = self.compiler(dtype, n)
            return self._compiled[key]

    def compiled_strided(self, dtype: str, n: int) -> Any:
        """The kernel for rows at any 16-byte-aligned stride, or None where there is none (an
        artifact's, or one whose compile refused such rows: those keep the dense copy)."""
        key = (dtype, n)
        with self._lock:
            if key not in self._strided:
                try:
                    fn = self.strided_compiler(dtype, n) if self.strided_compiler is not None else None
                except Exception:  # noqa: BLE001 - a speed path: the copy path still takes the call
                    fn = None
                self._strided[key] = fn
            return self._strided[key]

    # ------------------------------------------------------------------ the fast call

    def __call__(self, *inputs: torch.Tensor, **scalars: float | int) -> torch.Tensor | list[torch.Tensor]:
        if self._grad and _is_grad_enabled():
            for t in inputs:  # (a loop, not any(map(...)): 0.1 us less a call)
                if t.requires_grad:
                    return self._grad_fn(*inputs, **scalars)
        if _is_compiling():
            return self._traced_call(inputs, scalars)
        x = inputs[0]
        try:
            key = (x.dtype, x.shape[-1], x.dim())
        except IndexError:  # a 0-d x
            return self._checked_call(inputs, scalars)
        fast = self._fast.get(key) if not scalars else self._given(key, scalars)
        if fast is None:
            return self._rows_call(inputs, scalars)
        try:
            return fast(*inputs)
        except (ValueError, TypeError, _NotFast):
            # the function checks in C what else can differ from call to call (dtypes, devices'
            # type, shapes, one M across all tensors, strides, 16-byte alignment) and refuses a
            # call before its launch: that call is taken again on the checked path
            return self._checked_call(inputs, scalars)

    def _fast_for(self, key: tuple[torch.dtype, int, int], scalars: dict) -> Callable[..., Any] | None:
        """The fast call for x's (dtype, N, dims) and these scalars, or None where none is planned."""
        return self._given(key, scalars) if scalars else self._fast.get(key)

    def fast_call(self, x: torch.Tensor, **scalars: float | int) -> Callable[..., Any] | None:
        """The fast call for rows like x's with these scalars bound (made once and kept), called with
        the tensors alone; None where none is planned yet (the first call of a (dtype, N) plans it).
        A C++ autograd node keeps it, so a call with eps given stays in C (runtime/autograd_nodes.cpp);
        like any fast call it refuses (ValueError, TypeError) what does not fit."""
        if x.dim() < 2:
            return None
        key = (x.dtype, x.shape[-1], x.dim())
        if key[:2] not in self._plans and self.vectors32 is not None:  # (as `_vectors32_call` registers)
            return self.vectors32._fast_for(key, scalars)
        return self._fast_for(key, scalars)

    def _values(self, scalars: dict) -> tuple[float | int, ...]:
        """The op's scalars in order: those given by keyword, the defaults for the rest, each
        in its default's type."""
        return tuple(type(d)(scalars.get(k, d)) for k, d in self.spec.scalars.items())

    def _given(self, key: tuple[torch.dtype, int, int], scalars: dict) -> Callable[..., Any] | None:
        """The fast call with these scalars (given by keyword, as every model passes eps): the
        plan's own where they are its defaults, else one made once for their values and kept;
        None where no plan exists or a name is not the op's (the checked path's word)."""
        plan = self._plans.get(key[:2])
        if plan is None or not scalars.keys() <= self.spec.scalars.keys():
            return None
        if (*key[:2], 2) not in self._fast:  # (none planned: several GPUs and no C call, `_fast_of`)
            return None
        try:
            values = self._values(scalars)
        except (TypeError, ValueError):
            return None
        if values == plan.values:
            return self._fast.get(key)
        fast = self._fast_given.get((*key, values))
        if fast is None:
            if len(self._fast_given) >= MAX_GIVEN:  # (a model passes a few values, not one a call)
                self._fast_given.clear()
            if key[2] < 2:  # (a 1-D x: the rows call views it as rows)
                return None
            given = dataclasses.replace(plan, values=values)
            fast = _fast_of(given) if key[2] == 2 else _native_function(given)
            if fast is None:
                return None
            self._fast_given[(*key, values)] = fast
        return fast

    def _rows_call(self, inputs: tuple[torch.Tensor, ...], scalars: dict) -> torch.Tensor | list[torch.Tensor]:
        """Rows with leading dims (viewed as (M, N)), or several GPUs where no C call is built: the
        plan's call with the checks made in Python; anything else takes the checked path."""
        x = inputs[0]
        plan = self._plans.get((x.dtype, x.shape[-1])) if x.dim() else None
        if plan is None or not scalars.keys() <= self.spec.scalars.keys():
            return self._checked_call(inputs, scalars)
        values = self._values(scalars) if scalars else plan.values
        n = plan.n
        m = x.numel() // n
        if not (0 < m and m * n < MAX_ELEMS and _dense(x) and x.is_cuda):
            return self._checked_call(inputs, scalars)
        if len(inputs) != plan.arity:
            return self._checked_call(inputs, scalars)
        dev = x.device
        ins = [x.view(m, n)]
        for v, (kind, dt) in zip(inputs[1:], plan.rest):
            if v.dtype != dt or v.device != dev or not _dense(v):
                return self._checked_call(inputs, scalars)
            if kind == "MN":
                if v.numel() != m * n or v.shape[-1] != n:
                    return self._checked_call(inputs, scalars)
                v = v.view(m, n)
            elif kind == "M":
                if v.numel() != m:
                    return self._checked_call(inputs, scalars)
                v = v.view(m)
            elif kind != "N" or v.dim() != 1 or v.shape[0] != n:  # (a fixed shape: the checked path's word)
                return self._checked_call(inputs, scalars)
            ins.append(v)
        outs = plan.alloc(tuple(ins))
        outs = [outs] if plan.one else list(outs)
        plan.fn(*ins, *outs, *values)
        return _shaped(outs, x.shape[:-1], self._row_outputs)

    def _vectors32_call(
        self, inputs: tuple[torch.Tensor, ...], scalars: dict
    ) -> torch.Tensor | list[torch.Tensor] | None:
        """16-bit rows with fp32 weights (and bias): the op compiled for fp32 (N,) tensors takes the
        call, and its C call becomes the alternate of ours (`native_call.set_alternate`), so the
        next such call starts and ends in C. None where this does not take the call."""
        other, x = self.vectors32, inputs[0]
        if other is None or not isinstance(x, torch.Tensor) or x.dtype not in (torch.bfloat16, torch.float16):
            return None
        vectors = [t for t, d in zip(inputs, self.spec.inputs) if d.dims == ("N",) and isinstance(t, torch.Tensor)]
        if not vectors or not all(t.dtype == torch.float32 for t in vectors):
            return None
        out = other(*inputs, **scalars)
        if x.dim() >= 2:
            key = (x.dtype, x.shape[-1], x.dim())
            ours, theirs = self._fast_for(key, scalars), other._fast_for(key, scalars)
            if native_call.is_caller(ours) and native_call.is_caller(theirs):
                native_call.set_alternate(ours, theirs)
            elif key[:2] not in self._plans and native_call.is_caller(plain := other._fast.get((*key[:2], 2))):
                # every call on these rows so far had fp32 vectors: ours has nothing planned, so its C
                # call (and an autograd node's, native_api.h) runs theirs until ours is planned
                native_call.register(self, dtype_name(x.dtype), key[1], 2, plain)
        return out

    def _strided_call(
        self, inputs: tuple[torch.Tensor, ...], scalars: dict
    ) -> torch.Tensor | list[torch.Tensor] | None:
        """x a slice of wider rows (x[:, :N]: each row dense and 16-byte aligned, the row stride
        not N) and every other input dense: the kernel compiled for strided rows reads x where it
        lies, one launch, where torch's row ops copy it first. Its C call is kept beside the dense
        one's (`native_call.set_strided`), so the next such call starts and ends in C. None where
        this does not take the call."""
        x = inputs[0]
        if self.strided_compiler is None or not isinstance(x, torch.Tensor) or x.dim() != 2:
            return None
        (m, n), (s0, s1) = x.shape, x.stride()
        if (
            m < 2
            or s1 != 1
            or s0 <= n
            or s0 * x.element_size() % _ALIGN
            or x.data_ptr() % _ALIGN
            or m * s0 >= MAX_ELEMS
        ):
            return None
        if not all(isinstance(t, torch.Tensor) and _dense(t) for t in inputs[1:]):
            return None
        plan = self._plans.get((x.dtype, n))
        if plan is None or not scalars.keys() <= self.spec.scalars.keys():
            return None
        fn = self.compiled_strided(dtype_name(x.dtype), n)
        if fn is None:
            return None
        strided = dataclasses.replace(plan, fn=bare_function(fn), values=self._values(scalars))
        fast = self._fast_for((x.dtype, n, 2), scalars)
        try:
            if native_call.is_caller(fast) and (call := _native_function(strided)) is not None:
                native_call.set_strided(fast, call)
                return call(*inputs)
            return _fast_function(strided)(*inputs)
        except (ValueError, TypeError, _NotFast):
            return None

    def _dense_call(self, inputs: tuple[torch.Tensor, ...], scalars: dict) -> torch.Tensor | list[torch.Tensor] | None:
        """A planned call on inputs laid out otherwise (a slice of wider rows, a broadcast
        vector, an offset that breaks alignment): each such input copied dense, as torch's own
        row ops do, then the fast call; None where that does not take it (the checks follow)."""
        x = inputs[0]
        if not isinstance(x, torch.Tensor) or x.dim() < 1:
            return None
        if not all(isinstance(t, torch.Tensor) for t in inputs) or all(map(_dense, inputs)):
            return None  # (dense already: the call was refused for another reason)
        fast = self._fast_for((x.dtype, x.shape[-1], x.dim()), scalars)
        if fast is None:
            return None
        dense = tuple(t if _dense(t) else t.clone(memory_format=torch.contiguous_format) for t in inputs)
        try:
            return fast(*dense)
        except (ValueError, TypeError, _NotFast):
            return None

    def _plan(self, dtype: str, n: int) -> None:
        """Decide once what fast calls at (dtype, N) need; ops whose tensors are not all rows,
        row vectors, per-row values or small inputs of a fixed shape (fixed-shape problems)
        always take the checked path."""
        spec = self.spec
        kinds = [_kind(t) for t in spec.tensors]
        n_in = len(spec.inputs)
        # (an output of one value, a total, is made (1,); other fixed shapes take the checked path)
        kinds[n_in:] = ["one" if t.dims == ("1",) else k for k, t in zip(kinds[n_in:], spec.outputs)]
        if not spec.flat_rows or None in kinds or kinds[0] != "MN" or "fixed" in kinds[n_in:]:
            self._unplanned.add((DTYPES[dtype], n))
            return
        pairs = [(k, t.torch_dtype(dtype)) for k, t in zip(kinds, spec.tensors)]
        pairs = pairs[:n_in] + [("like", dt) if (k, dt) == pairs[0] else (k, dt) for k, dt in pairs[n_in:]]
        fn = bare_function(self.compiled(dtype, n))
        rest, outs = tuple(pairs[1:n_in]), tuple(pairs[n_in:])
        plan = _Plan(
            fn,
            n,
            rest,
            outs,
            tuple(spec.scalars.values()),
            _allocator(rest, outs),
            n_in,
            len(outs) == 1,
            DTYPES[dtype],
        )
        self._plans[(DTYPES[dtype], n)] = plan
        fast = _fast_of(plan)
        if fast is None:  # (several GPUs and no C call: `_rows_call` checks each tensor's device)
            return
        self._fast[(DTYPES[dtype], n, 2)] = fast
        if native_call.is_caller(fast):  # a call on such rows starts and ends in C
            # (and on rows with leading dims: the C call sees them as one M, as a view)
            for dims in range(3, MAX_LEAD_DIMS + 2):
                self._fast[(DTYPES[dtype], n, dims)] = fast
            native_call.register(self, dtype, n, 2, fast)

    # ------------------------------------------------------------------ the checked call

    def _launch(self, *args: torch.Tensor) -> None:
        """The torch.library op's CUDA implementation (what a compiled graph calls)."""
        n_in, n_all = len(self.spec.inputs), len(self.spec.tensors)
        # a graph may hand over a view at an unaligned offset: inputs are copied, outputs are ours
        ins = [v.clone() if v.data_ptr() % _ALIGN else v for v in args[:n_in]]
        self._run(ins, list(args[n_in:n_all]), list(args[n_all:]))

    def _run(self, ins: list[torch.Tensor], outs: list[torch.Tensor], vals: list) -> None:
        self.compiled(dtype_name(ins[0].dtype), ins[0].shape[self._n_axis])(*ins, *outs, *vals)

    def _traced_call(self, inputs: tuple[torch.Tensor, ...], scalars: dict) -> torch.Tensor | list[torch.Tensor]:
        """Under torch.compile: no data pointers and no Python-side compile, only torch ops and
        the torch.library op (opaque to the compiler, with its fake), so fullgraph=True holds."""
        spec = self.spec
        if self.op_name is None:
            raise OpError(f"{spec.name} is not a torch.library op here: torch.compile cannot call it")
        if (done := self._heads_call(inputs, scalars, self._traced_call)) is not None:
            return done
        x = inputs[0]
        dtype = dtype_name(x.dtype)
        n = x.shape[self._n_axis]
        m = x.numel() // n if spec.flat_rows else x.shape[0]
        ins = []
        for t, v in zip(spec.inputs, inputs):
            v = v.contiguous()
            if spec.flat_rows and t.dims in (("M", "N"), ("M",)):
                v = v.reshape(t.shape(m, n))
            ins.append(v)
        outs = spec.alloc_outputs(m, n, dtype, x.device)
        vals = self._values(scalars)
        getattr(torch.ops.llmcompile, self.op_name)(*ins, *outs, *vals)
        if not spec.flat_rows:
            return outs[0] if len(outs) == 1 else outs
        return _shaped(outs, x.shape[:-1], self._row_outputs)

    def prepare(self, *inputs: torch.Tensor) -> tuple[list[torch.Tensor], int, int, str]:
        """Validate inputs against the spec; flatten leading dims into M; make them
        contiguous and 16-byte aligned (copies only where they are not)."""
        spec = self.spec
        if len(inputs) != len(spec.inputs):
            names = ", ".join(t.name for t in spec.inputs)
            raise OpError(f"{spec.name} takes {len(spec.inputs)} tensors ({names}), got {len(inputs)}")
        x = inputs[0]
        if not spec.flat_rows:
            return self._prepare_fixed(inputs)
        if x.dim() < 1 or x.shape[-1] == 0:
            raise OpError(f"{spec.name}: x must have a non-empty last dimension, got shape {tuple(x.shape)}")
        if not x.is_cuda:
            raise OpError(f"{spec.name}: tensors must be on a CUDA device, x is on {x.device}")
        dtype = dtype_name(x.dtype)
        n = x.shape[-1]
        m = x.numel() // n
        spec.check_problem(max(m, 1), n, dtype)
        out = []
        for t, v in zip(spec.inputs, inputs):
            want, expect = t.torch_dtype(dtype), t.shape(m, n)
            if t.dims in (("M", "N"), ("M",)) and v.numel() == math.prod(expect):
                v = v.reshape(expect)
            if tuple(v.shape) != expect or v.dtype != want:
                raise OpError(
                    f"{spec.name}: {t.name} must be {want} of shape {expect} "
                    f"(from x of shape {tuple(x.shape)}), got {v.dtype} {tuple(v.shape)}"
                )
            if v.device != x.device:
                raise OpError(f"{spec.name}: {t.name} is on {v.device}, x on {x.device}")
            if not _dense(v):
                v = v.contiguous() if not v.is_contiguous() else v.clone()
            out.append(v)
        return out, m, n, dtype

    def _prepare_fixed(self, inputs: tuple[torch.Tensor, ...]) -> tuple[list[torch.Tensor], int, int, str]:
        """Custom ops: every tensor has its problem's shape, with the leading M free."""
        spec, x = self.spec, inputs[0]
        if not x.is_cuda:
            raise OpError(f"{spec.name}: tensors must be on a CUDA device, x is on {x.device}")
        m, n = x.shape[0], x.shape[self._n_axis] if x.dim() else 0
        # a fixed problem takes one dtype; a built-in op of fixed layout (attention), several
        dtype = next((d for d in spec.dtypes if DTYPES[d] == x.dtype), spec.dtypes[0])
        out = []
        for t, v in zip(spec.inputs, inputs):
            expect, want = t.shape(m, n), t.torch_dtype(dtype)
            if tuple(v.shape) != expect or v.dtype != want:
                raise OpError(f"{spec.name}: {t.name} must be {want} of shape {expect}, got {v.dtype} {tuple(v.shape)}")
            if not v.is_contiguous():
                v = v.contiguous()
            elif v.data_ptr() % _ALIGN:
                v = v.clone()
            out.append(v)
        return out, m, n, dtype

    def _fixed_call(self, inputs: tuple[torch.Tensor, ...], scalars: dict) -> torch.Tensor | list[torch.Tensor] | None:
        """A fixed-layout op (attention): each input checked against the shapes its x implies and
        the bare kernel called (the checks below and the compiled wrapper took 36 us of host a call
        against cuDNN's 21 on an H200 machine); None where the checked path decides."""
        x = inputs[0]
        if not isinstance(x, torch.Tensor) or x.dim() < 2 or not x.shape[0] or not x.is_cuda:
            return None
        key = (x.dtype, x.shape[0], x.shape[self._n_axis])
        plan = self._fixed.get(key)
        if plan is None:
            dtype = next((d for d in self.spec.dtypes if DTYPES[d] == x.dtype), None)
            if dtype is None:
                return None
            if len(self._fixed) >= MAX_GIVEN:  # (a model runs a few shapes, not one a call)
                self._fixed.clear()
            shapes = [(t.shape(key[1], key[2]), t.torch_dtype(dtype)) for t in self.spec.tensors]
            n_in = len(self.spec.inputs)
            plan = self._fixed[key] = [shapes[:n_in], shapes[n_in:], None, dtype, None]
        ins, outs, fn, dtype, caller = plan
        if len(inputs) != len(ins):
            return None
        dev = x.device
        for v, (shape, dt) in zip(inputs, ins):
            if not isinstance(v, torch.Tensor) or v.shape != shape or v.dtype != dt or v.device != dev or not _dense(v):
                return None
        if fn is None:  # (compiled once the inputs fit)
            fn = plan[2] = bare_function(self.compiled(dtype, key[2]))
            caller = plan[4] = _fixed_caller(fn, ins, outs, self._values({}))
        if caller is not None and (not scalars or self._values(scalars) == self._values({})):
            try:  # (its outputs made in C; it refuses what the kernel's int32 indexing cannot take)
                return caller(*inputs)
            except (TypeError, ValueError):
                pass
        made = [torch.empty(shape, dtype=dt, device=dev) for shape, dt in outs]
        fn(*inputs, *made, *self._values(scalars))
        return made[0] if len(made) == 1 else made

    def fixed_caller(self, x: torch.Tensor) -> Any | None:
        """A fixed-layout op's call in C (`_fixed_caller`) for inputs of the shapes x implies, with
        the op's default scalars, once a call of those shapes has made it; else None. The
        attention's C++ node runs it (runtime/autograd_nodes.cpp) after checking k's and v's
        shapes against q's: it checks no shape itself."""
        if self.spec.flat_rows or x.dim() < 2:
            return None
        plan = self._fixed.get((x.dtype, x.shape[0], x.shape[self._n_axis]))
        if plan is None or tuple(x.shape) != tuple(plan[0][0][0]):  # (a head dim the op does not have)
            return None
        return plan[4]

    def strided_v_call(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor) -> torch.Tensor | None:
        """lse of an attention with q and k dense (M, N, D) and v (B, H, N, D) at its own strides (B
        x H = M; a model's v, a transposed view of its projection's output), read where it lies by
        the kernel compiled for it, its o written into `o`, (B, H, N, D) at its own strides, with
        the op's default scalars; None where this kernel or layout cannot take them (the caller then
        copies v dense). The attention's C++ node calls it (runtime/autograd_nodes.cpp): a dense
        copy of v cost a training step's forward its host time and a launch, and flash-attention's
        backward copies an o not laid out as (B, N, H, D)."""
        fn = self._strided_v_of(q, k, v, o)
        if fn is False or k.shape != q.shape or not (q.is_contiguous() and k.is_contiguous()):
            return None
        if any(t.data_ptr() % _ALIGN for t in (q, k, v, o)) or not q.device == k.device == v.device == o.device:
            return None
        lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
        fn(q, k, v, o, lse, *self._values({}))
        return lse

    def strided_v_caller(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor) -> Any | None:
        """`strided_v_call`'s kernel as a call in C (`native_call`: q, k, v and o in, lse made there)
        for tensors of these shapes, v and o of these strides: what the C++ node runs, asking once a
        layout (the Python call and its torch.empty cost as much host time as v's copy saved); None
        where there is none. It checks no shape itself: the node checks q's, k's, v's and o's; the
        kernel refuses strides it cannot take."""
        fn = self._strided_v_of(q, k, v, o)
        if fn is False:
            return None
        ins = [(t.shape, t.dtype) for t in (q, k, v, o)]
        return _fixed_caller(fn, ins, [(q.shape[:2], torch.float32)], self._values({}))

    def _strided_v_of(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor) -> Any:
        """The strided-v kernel (bare) for this layout, decided once a layout; False where none."""
        if not STRIDED_V:
            return False
        key = (q.dtype, q.shape, v.shape, v.stride(), o.shape, o.stride())
        fn = self._strided_v.get(key)
        if fn is None:
            if len(self._strided_v) >= MAX_GIVEN:  # (a model runs a few layouts)
                self._strided_v.clear()
            fn = self._strided_v[key] = self._strided_v_function(q, k, v, o)
        return fn

    def _strided_v_function(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor) -> Any:
        """The strided-v kernel for these shapes (False where it does not apply)."""
        dtype = next((d for d in self.spec.dtypes if DTYPES[d] == q.dtype), None)

        def heads(t: torch.Tensor) -> bool:  # (B, H, N, D) of q's (M, N, D), rows 16-byte aligned
            return (
                t.dim() == 4
                and t.dtype == q.dtype
                and t.shape[0] * t.shape[1] == q.shape[0]
                and t.shape[2:] == q.shape[1:]
                and t.stride(-1) == 1
                and all(s * t.element_size() % _ALIGN == 0 for s in t.stride()[:3])
            )

        fits = (
            dtype is not None
            and self.strided_compiler is not None
            and not self.spec.flat_rows
            and q.is_cuda  # (off the GPU the dense call says so, not the kernel)
            and q.dim() == 3
            and k.dtype == q.dtype
            and heads(v)
            and heads(o)
            and q.numel() < MAX_ELEMS  # (the kernels index with 32 bits)
        )
        fn = self.compiled_strided(dtype, q.shape[1]) if fits else None
        return False if fn is None else bare_function(fn)

    def _heads_call(
        self, inputs: tuple[torch.Tensor, ...], scalars: dict, call: Callable[..., Any], strided_v: bool = False
    ) -> torch.Tensor | list[torch.Tensor] | None:
        """A fixed-layout op (attention's (M, N, D)) on inputs of one more leading dim, as SDPA takes
        them (batch, heads, sequence, head dim): the two seen as M (a view where they merge, a copy
        where not, as a transposed v), the outputs given back both; None for any other call.
        `strided_v` (an eager call): a v whose dims do not merge is read where it lies, where the
        strided-v kernel can take it (`_strided_v_heads`)."""
        x = inputs[0]
        if self.spec.flat_rows or not isinstance(x, torch.Tensor) or x.dim() != len(self.spec.tensors[0].dims) + 1:
            return None
        lead = x.shape[:2]
        if not all(isinstance(v, torch.Tensor) and v.dim() == x.dim() and v.shape[:2] == lead for v in inputs):
            return None
        if strided_v and (done := self._strided_v_heads(inputs, scalars)) is not None:
            return done
        outs = call(tuple(v.reshape(-1, *v.shape[2:]) for v in inputs), scalars)
        shaped = [o.view(*lead, *o.shape[1:]) for o in (outs if isinstance(outs, list) else [outs])]
        return shaped[0] if len(shaped) == 1 else shaped

    def _strided_v_heads(self, inputs: tuple[torch.Tensor, ...], scalars: dict) -> list[torch.Tensor] | None:
        """An attention's 4-D call without grad whose v does not merge into (M, N, D) (a model's, a
        transposed view of its projection's output): given to its differentiable call (`grad_fn`:
        the C++ node's call, else the Python Function), which reads v where it lies
        (`strided_v_call`) with or without grad, rather than v copied here (one more launch, v's
        bytes twice). Where the C call and the nodes are built, such a call goes from C to the node
        and never comes here (native_call's `set_node(..., ndim=4)`). None for any other call
        (scalars given, a dense v): the 3-D call takes it."""
        if self._grad_fn is None or scalars or len(inputs) != 3 or inputs[2].is_contiguous() or not inputs[0].is_cuda:
            return None  # (a CPU q: the checked path says so)
        return list(self._grad_fn(*inputs))

    def _checked_call(self, inputs: tuple[torch.Tensor, ...], scalars: dict) -> torch.Tensor | list[torch.Tensor]:
        unknown = set(scalars) - set(self.spec.scalars)
        if unknown:
            raise OpError(f"{self.spec.name} takes no argument {', '.join(sorted(unknown))}")
        if (done := self._heads_call(inputs, scalars, self._checked_call, strided_v=True)) is not None:
            return done
        if not self.spec.flat_rows and (done := self._fixed_call(inputs, scalars)) is not None:
            return done
        if (done := self._vectors32_call(inputs, scalars)) is not None:
            return done
        if (done := self._strided_call(inputs, scalars)) is not None:
            return done
        if (done := self._dense_call(inputs, scalars)) is not None:
            return done
        lead = inputs[0].shape[:-1]
        ins, m, n, dtype = self.prepare(*inputs)
        outs = self.spec.alloc_outputs(m, n, dtype, ins[0].device)
        vals = self._values(scalars)
        if not self.spec.flat_rows:
            if m > 0:
                self._run(ins, outs, vals)
            return outs[0] if len(outs) == 1 else outs
        if m > 0:
            plan = self._plans.get((DTYPES[dtype], n))
            if plan is not None:  # the bare function: the compiled wrapper's conversions cost tens of us
                plan.fn(*ins, *outs, *vals)
            else:
                self._run(ins, outs, vals)
            if plan is None and (DTYPES[dtype], n) not in self._unplanned:
                self._plan(dtype, n)
        else:  # no rows: a sum over them (a norm backward's dw) is 0
            for o, rows in zip(outs, self._row_outputs):
                if not rows:
                    o.zero_()
        return _shaped(outs, lead, self._row_outputs)


native_call.install(KernelFunction)
