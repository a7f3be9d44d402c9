"""A flat-rows op's plan at one (dtype, N), and the fast calls made of it.

Everything a call on rows needs that depends only on (dtype, N) is decided once, in a `Plan`;
`fast_of` turns it into the call itself: in C where `native_call` builds (no Python at all), else
one small Python function specialised to the plan. Both refuse (ValueError, TypeError, `NotFast`)
what does not fit, before the launch; `callpath.KernelFunction` takes such a call again on its
checked path."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from llmcompile.runtime import native_call
from llmcompile.specs import MAX_ELEMS, TensorDesc
from llmcompile.specs.contract import WithWorkspace

ALIGN = 16  # bytes: a compiled kernel's tensors start at a multiple of it


@dataclass(frozen=True)
class Plan:
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


def allocator(
    rest: tuple[tuple[str, torch.dtype], ...], outs: tuple[tuple[str, torch.dtype], ...]
) -> Callable[[tuple[torch.Tensor, ...]], Any]:
    like: dict[str, int] = {}  # an input of shape (M,) or (N,), which an output of that shape is made like
    for i, (kind, _) in enumerate(rest):
        like.setdefault(kind, i + 1)
    makers = [_maker(kind, dt, like) for kind, dt in outs]
    if len(makers) == 1:
        return makers[0]
    return lambda ins: tuple(mk(ins) for mk in makers)


def is_dense(t: torch.Tensor) -> bool:
    """Laid out as a compiled kernel reads a tensor: contiguous, 16-byte aligned."""
    return t.is_contiguous() and not t.data_ptr() % ALIGN


class NotFast(Exception):
    """A call the fast function does not take (no rows, too many elements, a wrong count)."""


def bare_function(fn: Any) -> Any:
    """The TVM-FFI function a compiled kernel wraps: CuTe DSL wraps a function with defaults in
    Python (0.4 us a call); anything else is returned as it is."""
    return getattr(fn, "__tvm_ffi_object__", lambda: fn)()


def native_function(plan: Plan) -> Callable[..., Any] | None:
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


def fast_of(plan: Plan) -> Callable[..., Any] | None:
    """The plan's fast call: in C where it can be built (it checks that every tensor is on x's
    device), else the Python one, which checks no device: on one GPU only (on a host of several,
    None: `KernelFunction._rows_call` checks each tensor's device)."""
    return native_function(plan) or (fast_function(plan) if torch.cuda.device_count() <= 1 else None)


def fast_function(plan: Plan) -> Callable[..., Any]:
    """The whole fast call of one plan as one small function, specialised where it pays (one input
    and one output of x's shape: softmax), so a call runs as few Python lines as possible."""
    fn, values, alloc, arity, limit = plan.fn, plan.values, plan.alloc, plan.arity, MAX_ELEMS
    empty_like = torch.empty_like
    if arity == 1 and plan.one and plan.outs[0][0] == "like" and not values:

        def rows_like(*ins: torch.Tensor) -> torch.Tensor:
            x = ins[0]
            if len(ins) != 1 or not 0 < x.numel() < limit:
                raise NotFast
            out = empty_like(x)
            fn(x, out)
            return out

        return rows_like
    if plan.one:

        def rows_one(*ins: torch.Tensor) -> torch.Tensor:
            if len(ins) != arity or not 0 < ins[0].numel() < limit:
                raise NotFast
            out = alloc(ins)
            fn(*ins, out, *values)
            return out

        return rows_one

    def rows_many(*ins: torch.Tensor) -> list[torch.Tensor]:
        if len(ins) != arity or not 0 < ins[0].numel() < limit:
            raise NotFast
        outs = alloc(ins)
        fn(*ins, *outs, *values)
        return list(outs)

    return rows_many


def shaped(
    outs: list[torch.Tensor], lead: torch.Size, rows: tuple[bool, ...] | None = None
) -> torch.Tensor | list[torch.Tensor]:
    """Flat-rows outputs given back the caller's leading dims; `rows[i]` False keeps output i
    as it is (a sum over the rows, as a norm backward's dw of shape (N,))."""
    given = [
        o if rows is not None and not rows[i] else o.reshape(*lead, *o.shape[1:]) if o.dim() == 2 else o.reshape(lead)
        for i, o in enumerate(outs)
    ]
    return given[0] if len(given) == 1 else given


def tensor_kind(t: TensorDesc) -> str | None:
    """What a plan makes of a tensor of the op: rows ("MN"), a value a row ("M"), a row vector
    ("N"), a small shape of its own ("fixed"); None: not a flat-rows tensor."""
    if all(d.isdigit() for d in t.dims):
        return "fixed"  # a shape of its own, as a cross-entropy's upstream scale (1,)
    return {("M", "N"): "MN", ("M",): "M", ("N",): "N"}.get(t.dims)
