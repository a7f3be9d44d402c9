"""The torch-facing call of a compiled kernel: `KernelFunction`, what `llmcompile.kernels.softmax`
and a loaded artifact are.

At small sizes the host time of a call, not bandwidth, decides the speed, so a call does as
little Python as it can: everything that depends only on (dtype, N) is decided once, in a
`plans.Plan`. A call on rows (a 2-D x) of a planned (dtype, N) starts and ends in C (`native_call`'s
Entry and Caller: the plan found by x's dtype and N, the inputs seen as DLTensors, the outputs
allocated by torch's allocator, the kernel's TVM-FFI function called on the current stream),
with no Python at all; where no C compiler built that, the Python `__call__` finds the plan and
makes the outputs from Python. The kernel's own checks, in C, refuse what does not fit (dtypes,
shapes, strides, alignment) before the launch; a refused call is taken again on the checked
path: full validation with clear errors, and copies where an input is not contiguous or
aligned. Leading dims cost a view each way. Under torch.compile a call is traced (through the
Python `__call__`) into the torch.library op, which has a fake implementation.

What it stands on, one job a module: `callspec` (what calling an op needs to know), `plans` (a
flat-rows op's plan and its fast calls), `fixed_layout` (attention's call forms), `native_call`
(the call in C). They import torch only: a loaded artifact runs without CuTe DSL.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable
from typing import Any

import torch

from llmcompile.runtime import native_call
from llmcompile.runtime.callspec import CallSpec, schema
from llmcompile.runtime.fixed_layout import FixedLayoutCalls
from llmcompile.runtime.plans import (
    ALIGN,
    NotFast,
    Plan,
    allocator,
    bare_function,
    fast_function,
    fast_of,
    is_dense,
    native_function,
    shaped,
    tensor_kind,
)
from llmcompile.specs import DTYPES, MAX_ELEMS, OpError, OpSpec, dtype_name

_LIB = torch.library.Library("llmcompile", "FRAGMENT")
_is_grad_enabled, _is_compiling = torch.is_grad_enabled, torch.compiler.is_compiling
MAX_GIVEN = 64  # fast calls kept for scalars given by keyword, across (dtype, N, values)
MAX_LEAD_DIMS = 4  # leading dims a Python-side lookup finds the C call for (in C: any)


class KernelFunction(FixedLayoutCalls, native_call.entry_base()):  # type: ignore[misc]
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
        self._init_fixed_layout()  # (attention's calls: fixed_layout.py)
        # the same op compiled with its (N,) tensors (weight, bias, their gradients) in fp32 beside
        # 16-bit rows, as mixed-precision training keeps weights (compiled.py sets it)
        self.vectors32: KernelFunction | None = None
        self._compiled: dict[tuple[str, int], Any] = dict(precompiled or {})
        self._plans: dict[tuple[torch.dtype, int], Plan] = {}
        self._unplanned: set[tuple[torch.dtype, int]] = set()  # (dtype, N) decided: no plan
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
            _LIB.define(f"{op_name}{schema(self.spec)}")
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
        except (ValueError, TypeError, NotFast):
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
        if (*key[:2], 2) not in self._fast:  # (none planned: several GPUs and no C call, `fast_of`)
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
            fast = fast_of(given) if key[2] == 2 else native_function(given)
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
        if not (0 < m and m * n < MAX_ELEMS and is_dense(x) and x.is_cuda):
            return self._checked_call(inputs, scalars)
        if len(inputs) != plan.arity:
            return self._checked_call(inputs, scalars)
        dev = x.device
        ins = [x.view(m, n)]
        for v, (kind, dt) in zip(inputs[1:], plan.rest):
            if v.dtype != dt or v.device != dev or not is_dense(v):
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
        return shaped(outs, x.shape[:-1], self._row_outputs)

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
        if m < 2 or s1 != 1 or s0 <= n or s0 * x.element_size() % ALIGN or x.data_ptr() % ALIGN or m * s0 >= MAX_ELEMS:
            return None
        if not all(isinstance(t, torch.Tensor) and is_dense(t) for t in inputs[1:]):
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
            if native_call.is_caller(fast) and (call := native_function(strided)) is not None:
                native_call.set_strided(fast, call)
                return call(*inputs)
            return fast_function(strided)(*inputs)
        except (ValueError, TypeError, NotFast):
            return None

    def _dense_call(self, inputs: tuple[torch.Tensor, ...], scalars: dict) -> torch.Tensor | list[torch.Tensor] | None:
        """A planned call on inputs laid out otherwise (a slice of wider rows, a broadcast
        vector, an offset that breaks alignment): each such input copied dense, as torch's own
        row ops do, then the fast call; None where that does not take it (the checks follow)."""
        x = inputs[0]
        if not isinstance(x, torch.Tensor) or x.dim() < 1:
            return None
        if not all(isinstance(t, torch.Tensor) for t in inputs) or all(map(is_dense, inputs)):
            return None  # (dense already: the call was refused for another reason)
        fast = self._fast_for((x.dtype, x.shape[-1], x.dim()), scalars)
        if fast is None:
            return None
        dense = tuple(t if is_dense(t) else t.clone(memory_format=torch.contiguous_format) for t in inputs)
        try:
            return fast(*dense)
        except (ValueError, TypeError, NotFast):
            return None

    def _plan(self, dtype: str, n: int) -> None:
        """Decide once what fast calls at (dtype, N) need; ops whose tensors are not all rows,
        row vectors, per-row values or small inputs of a fixed shape (fixed-shape problems)
        always take the checked path."""
        spec = self.spec
        kinds = [tensor_kind(t) for t in spec.tensors]
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
        plan = Plan(
            fn,
            n,
            rest,
            outs,
            tuple(spec.scalars.values()),
            allocator(rest, outs),
            n_in,
            len(outs) == 1,
            DTYPES[dtype],
        )
        self._plans[(DTYPES[dtype], n)] = plan
        fast = fast_of(plan)
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
        ins = [v.clone() if v.data_ptr() % ALIGN else v for v in args[:n_in]]
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
        return shaped(outs, x.shape[:-1], self._row_outputs)

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
            if not is_dense(v):
                v = v.contiguous() if not v.is_contiguous() else v.clone()
            out.append(v)
        return out, m, n, dtype

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
        return shaped(outs, lead, self._row_outputs)


native_call.install(KernelFunction)
