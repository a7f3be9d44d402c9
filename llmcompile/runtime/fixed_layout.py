"""The call forms of a fixed-layout op (attention's q, k, v of (M, N, D)): each tensor checked
against the shapes q implies, SDPA's 4-D (batch, heads, N, D) seen as M, a model's strided v read
where it lies, and the calls in C that the attention's C++ node keeps (`fixed_caller`,
`strided_v_caller`). `FixedLayoutCalls` is a part of `callpath.KernelFunction`, kept apart from its
flat-rows path: the C++ node and autograd find these methods by name on the kernel function."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from llmcompile.runtime import native_call
from llmcompile.runtime.callspec import CallSpec
from llmcompile.runtime.plans import ALIGN, bare_function, is_dense
from llmcompile.specs import DTYPES, MAX_ELEMS, OpError

MAX_KEPT = 64  # shapes and layouts kept, each (a model runs a few, not one a call)
# An attention's v read where it lies ((B, H, N, D) strided, `strided_v_call`) rather than copied
# dense, and o written as the backward's kernel reads it; LLMCOMPILE_STRIDED_V=0 copies v and writes
# o dense (the comparison in evals/results/host-time)
STRIDED_V = os.environ.get("LLMCOMPILE_STRIDED_V", "1") != "0"


def make_fixed_caller(fn: Any, ins: list, outs: list, values: tuple) -> Any | None:
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


class FixedLayoutCalls:
    """The fixed-layout call forms of a kernel function (`callpath.KernelFunction`, which holds what
    is annotated here and calls `_init_fixed_layout` when it is made)."""

    spec: CallSpec
    strided_compiler: Callable[[str, int], Any] | None
    _n_axis: int  # where N is in q's dims
    _grad_fn: Callable[..., Any] | None
    compiled: Callable[[str, int], Any]
    compiled_strided: Callable[[str, int], Any]
    _values: Callable[[dict], tuple[float | int, ...]]

    def _init_fixed_layout(self) -> None:
        # the shapes and kernel per (dtype, M, N): `_fixed_call`
        self._fixed: dict[tuple[torch.dtype, int, int], list[Any]] = {}
        # the strided-v kernel (bare) per (dtype, q's shape, v's shape and strides), or False where
        # that layout cannot take it: `strided_v_call`
        self._strided_v: dict[tuple[Any, ...], Any] = {}

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
            elif v.data_ptr() % ALIGN:
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
            if len(self._fixed) >= MAX_KEPT:  # (a model runs a few shapes, not one a call)
                self._fixed.clear()
            shapes = [(t.shape(key[1], key[2]), t.torch_dtype(dtype)) for t in self.spec.tensors]
            n_in = len(self.spec.inputs)
            plan = self._fixed[key] = [shapes[:n_in], shapes[n_in:], None, dtype, None]
        ins, outs, fn, dtype, caller = plan
        if len(inputs) != len(ins):
            return None
        dev = x.device
        for v, (shape, dt) in zip(inputs, ins):
            if (
                not isinstance(v, torch.Tensor)
                or v.shape != shape
                or v.dtype != dt
                or v.device != dev
                or not is_dense(v)
            ):
                return None
        if fn is None:  # (compiled once the inputs fit)
            fn = plan[2] = bare_function(self.compiled(dtype, key[2]))
            caller = plan[4] = make_fixed_caller(fn, ins, outs, self._values({}))
        if caller is not None and (not scalars or self._values(scalars) == self._values({})):
            try:  # (its outputs made in C; it refuses what the kernel's int32 indexing cannot take)
                return caller(*inputs)
            except (TypeError, ValueError):
                pass
        made = [torch.empty(shape, dtype=dt, device=dev) for shape, dt in outs]
        fn(*inputs, *made, *self._values(scalars))
        return made[0] if len(made) == 1 else made

    def fixed_caller(self, x: torch.Tensor) -> Any | None:
        """A fixed-layout op's call in C (`make_fixed_caller`) for inputs of the shapes x implies, with
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
        if any(t.data_ptr() % ALIGN for t in (q, k, v, o)) or not q.device == k.device == v.device == o.device:
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
        return make_fixed_caller(fn, ins, [(q.shape[:2], torch.float32)], self._values({}))

    def _strided_v_of(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor) -> Any:
        """The strided-v kernel (bare) for this layout, decided once a layout; False where none."""
        if not STRIDED_V:
            return False
        key = (q.dtype, q.shape, v.shape, v.stride(), o.shape, o.stride())
        fn = self._strided_v.get(key)
        if fn is None:
            if len(self._strided_v) >= MAX_KEPT:  # (a model runs a few layouts)
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
                and all(s * t.element_size() % ALIGN == 0 for s in t.stride()[:3])
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
