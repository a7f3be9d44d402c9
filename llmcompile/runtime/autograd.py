"""Differentiable calls: a torch.autograd.Function per op, its forward kernel saving what its
backward kernel needs (softmax's output y, cross-entropy's log-sum-exp, a norm's rstd and mean).

`llmcompile.kernels.softmax(x)` comes here when an input requires grad and grad mode is on, and takes
the lean call otherwise (`KernelFunction.grad_fn`). Under torch.compile the Functions are traced,
and the kernels inside them are the torch.library ops.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

from llmcompile.runtime import attention_backward, autograd_native, native_call
from llmcompile.runtime import compiled as kernels
from llmcompile.specs import BUILTIN

_raw_apply = torch._C._FunctionBase.__dict__["apply"]
_functorch_active = torch._C._are_functorch_transforms_active
_wrapped = torch._C._functorch.is_functorch_wrapped_tensor
_is_compiling = torch.compiler.is_compiling


def _lean_apply(cls: type[torch.autograd.Function]) -> Any:
    """`cls.apply` without the Python wrapper torch puts around it: the wrapper binds default
    arguments for a `setup_context` (ours have none) and unwraps functorch's dead wrappers, and
    costs about as much as the rest of a small op's forward through autograd (17 of 35 us on
    the CPU machine). The wrapper is kept where it does something: under functorch transforms,
    for a functorch-wrapped tensor, and while torch.compile traces (dynamo reads `cls.apply`)."""
    raw = _raw_apply.__get__(None, cls)

    def apply(*args: Any) -> Any:
        if _is_compiling() or _functorch_active():  # (dynamo knows is_compiling: asked first)
            return cls.apply(*args)
        for a in args:
            if isinstance(a, torch.Tensor) and _wrapped(a):
                return cls.apply(*args)
        return raw(*args)

    return apply


class SoftmaxFunction(torch.autograd.Function):
    """Softmax or log-softmax over the last dim: y saved, dx from (dy, y)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, log: bool) -> torch.Tensor:
        y = (kernels.log_softmax if log else kernels.softmax)(x)
        ctx.save_for_backward(y)
        ctx.log = log
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, None]:
        (y,) = ctx.saved_tensors
        if (c := _one_value(dy, y)) is not None:  # read as that value, not made dense first
            return (kernels.log_softmax_bwd_scalar if ctx.log else kernels.softmax_bwd_scalar)(y, c), None
        bwd = kernels.log_softmax_bwd if ctx.log else kernels.softmax_bwd
        return bwd(_like(dy, y).contiguous(), y), None


def _one_value(g: torch.Tensor, like: torch.Tensor) -> torch.Tensor | None:
    """An upstream gradient that is one value expanded (every stride 0), as `.sum()` hands it, as
    that value: a (1,) view in `like`'s dtype, which the backward kernels for one value
    (*_bwd_scalar) read in place, where the rows kernels need it dense first (one more launch a
    training step). None for any other gradient. (autograd_nodes.cpp's `one_value` in C++.)"""
    if g.numel() < 2 or any(g.stride()):
        return None
    return _like(g, like).as_strided((1,), (1,))


def _like(t: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """t in other's dtype (a call of `.to` costs host time even where it changes nothing)."""
    return t if t.dtype == other.dtype else t.to(other.dtype)


def _given(op: str, **scalars: float | int) -> dict:
    """The scalars that differ from the op's defaults: a call with none starts and ends in C; one
    with any goes through the Python call first (keywords), then a fast call kept for its values."""
    defaults = BUILTIN[op].scalars
    return {k: v for k, v in scalars.items() if v != defaults[k]}


class CrossEntropyFunction(torch.autograd.Function):
    """Per-row cross-entropy (reduction 'none'): the forward also writes each row's lse; the
    backward reads the logits once more and writes dlogits."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, target: torch.Tensor, ignore_index: int) -> torch.Tensor:
        scalars = _given("cross_entropy_fwd", ignore_index=ignore_index)
        loss, lse = kernels.cross_entropy_fwd(x, target, **scalars)
        ctx.save_for_backward(x, target, lse)
        ctx.scalars = scalars
        return loss

    @staticmethod
    def backward(ctx: Any, dloss: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        x, target, lse = ctx.saved_tensors
        if (g := _one_value(dloss, lse)) is not None:
            # loss.sum().backward() hands dloss expanded from one value g (every stride 0): dx is
            # g * (softmax(x) - onehot), what the fused kernel writes for the scale g, read in
            # place. Making dloss a dense vector first was one more launch a step (0.963x QuACK's
            # step at 32768 x 512 bf16 under graphs, issue 47); the fused kernel moves the
            # bytes the backward does (x in, dx out) and recomputes lse instead of reading it.
            return kernels.cross_entropy_fused(x, target, g, **ctx.scalars)[1], None, None
        return kernels.cross_entropy_bwd(x, target, lse, _like(dloss, lse).contiguous(), **ctx.scalars), None, None


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t as the kernels read it: the fast call views leading dims as rows itself, so a dense t
    (any rank) goes as it is; anything else is copied dense once, here, and saved that way."""
    return t if t.is_contiguous() else t.contiguous()


_ONES: dict[torch.device, torch.Tensor] = {}


def _one(device: torch.device) -> torch.Tensor:
    """A (1,) fp32 1 on `device` (a sum's scale beside the upstream gradient), made once (not
    inside a CUDA graph's capture, whose memory it would hold)."""
    one = _ONES.get(device)
    if one is None:
        one = torch.ones(1, device=device)
        if not (one.is_cuda and torch.cuda.is_current_stream_capturing()):
            _ONES[device] = one
    return one


def _flat(t: torch.Tensor) -> torch.Tensor:
    """t as (rows, N), dense: the loss's rows line up with its targets flattened."""
    return t.reshape(-1, t.shape[-1]).contiguous()


class RMSNormFunction(torch.autograd.Function):
    """RMSNorm over the last dim (leading dims flattened into rows): rstd saved; dx and dw
    (summed over rows, deterministically) from (dy, x, w, rstd)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x = _rows(x)
        out, rstd = kernels.rmsnorm_fwd(x, weight, **_given("rmsnorm_fwd", eps=eps))
        ctx.save_for_backward(x, weight, rstd)
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, weight, rstd = ctx.saved_tensors
        if (c := _one_value(dout, x)) is not None:
            dx, dw = kernels.rmsnorm_bwd_scalar(x, c, weight, rstd)
        else:
            dx, dw = kernels.rmsnorm_bwd(_rows(_like(dout, x)), x, weight, rstd)
        return dx, dw, None


class LayerNormFunction(torch.autograd.Function):
    """LayerNorm over the last dim: mean and rstd saved; dx, dw and db from (dy, x, w, mean, rstd)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
        x = _rows(x)
        out, mean, rstd = kernels.layernorm_fwd(x, weight, bias, **_given("layernorm_fwd", eps=eps))
        ctx.save_for_backward(x, weight, mean, rstd)
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:
        x, weight, mean, rstd = ctx.saved_tensors
        if (c := _one_value(dout, x)) is not None:
            dx, dw, db = kernels.layernorm_bwd_scalar(x, c, weight, mean, rstd)
        else:
            dx, dw, db = kernels.layernorm_bwd(_rows(_like(dout, x)), x, weight, mean, rstd)
        return dx, dw, db, None


class CrossEntropyLossFunction(torch.autograd.Function):
    """The mean (or sum) of cross-entropy over rows, its gradient written in the forward pass
    (`cross_entropy_fused_total`): the logits are read once and not kept for the backward, so they
    may be freed as soon as the loss is computed (Liger's and QuACK's memory-saving trick). Where
    the C++ nodes are built, the kernel's own ignore_index takes autograd_nodes.cpp's `LossBackward`
    instead, which does the same from C++."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, target: torch.Tensor, ignore_index: int, mean: bool) -> torch.Tensor:
        # one call: the rows' losses, dx for an upstream 1, and the sum, mean and 1/kept on the
        # device (the sum and count in torch ops after the kernel were five launches, 10-30 us of
        # host each on an H200 machine: 1.70x torch's host time, issue 47)
        _, dx, total, mean_total, inv_kept = kernels.cross_entropy_fused_total(
            _flat(x), target.reshape(-1), **_given("cross_entropy_fused_total", ignore_index=ignore_index)
        )
        ctx.save_for_backward(dx)
        # (a sum's scale is 1: made once per device, or in the graph torch.compile traces)
        ctx.by = inv_kept if mean else torch.ones_like(inv_kept) if _is_compiling() else _one(x.device)
        ctx.shape, ctx.applied = x.shape, None
        return (mean_total if mean else total).view(())

    @staticmethod
    def backward(ctx: Any, dloss: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        (dx,) = ctx.saved_tensors
        # dx is the gradient for an upstream 1. The upstream gradient scales it on the device, in
        # place: asking whether it is 1 (as Liger does) is a host sync, and a training step then
        # waits for its whole forward before it can launch its backward (a Llama step on an H200:
        # 16.4 ms against torch's 11.2, evals/results/training-run). Through .data, so the saved
        # tensor's version stays and a second backward of the graph (retain_graph) can still read
        # dx: it finds it scaled by the first's upstream gradient, and rescales a copy.
        g = dloss.reshape(1)
        if ctx.applied is None:
            ctx.applied = g
            return kernels.scale_(dx.data, g, ctx.by).view(ctx.shape), None, None, None
        if not ctx.applied.item():  # (only a second backward pays this sync)
            raise RuntimeError(
                "cross_entropy_loss: its first backward had an upstream gradient of 0, which erased the "
                "gradient it keeps; a second backward of this graph needs a new forward"
            )
        return (dx * (g / ctx.applied)).view(ctx.shape), None, None, None


class AttentionFunction(torch.autograd.Function):
    """Softmax attention over q, k, v of (batch x heads, sequence, head dim), or (batch, heads,
    sequence, head dim) as SDPA takes them: our forward kernel `fn` writes o and each query's
    log-sum-exp; the backward is torch's attention backward kernel fed those (`attention_backward`:
    we have no attention backward kernel yet). The lse carries no gradient."""

    @staticmethod
    def forward(ctx: Any, fn: Any, causal: bool, scale: float, scalars: dict, *qkv: torch.Tensor) -> tuple:
        shapes = tuple(t.shape for t in qkv)
        # (b·h, s, d) dense, what the kernel reads and cuDNN's backward beside o: a view where the
        # dims merge, a copy where not; inside the Function, so a model's 4-D call makes no view
        # nodes of its own around it. SDPA's 4-D v that does not merge (a model's, transposed from
        # its projection's layout) is read where it lies where the kernel function can.
        q, k, v = qkv
        flat = [t.reshape(-1, *t.shape[-2:]).contiguous() for t in (q, k)]
        o = lse = None
        strided_v_call = getattr(fn, "strided_v_call", None)
        if strided_v_call and v.dim() == 4 and not v.is_contiguous() and not scalars and q.shape == v.shape:
            o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
            lse = strided_v_call(*flat, v, o)
        if lse is None:
            flat.append(v.reshape(-1, *v.shape[-2:]).contiguous())
            o, lse = fn(*flat, **scalars)
            v = flat[2].view(shapes[2])
        # saved in the caller's shape, so the backward hands torch's kernel the upstream gradient as
        # it comes (a model's is a transposed view: reshaped, it would be copied)
        o, lse = o.view(shapes[0]), lse.view(shapes[0][:-1])
        ctx.save_for_backward(flat[0].view(shapes[0]), flat[1].view(shapes[1]), v, o, lse)
        ctx.causal, ctx.scale = causal, scale
        # (lse leaves detached by the caller, not marked non-differentiable here: torch 2.11's
        # torch.compile traced the mark as a differentiable output and failed its backward)
        ctx.set_materialize_grads(False)  # (lse's gradient, never read, made a zeros launch a backward)
        return o, lse

    @staticmethod
    def backward(ctx: Any, do: torch.Tensor | None, _: None) -> tuple:
        if do is None:
            return (None,) * 7
        q, k, v, o, lse = ctx.saved_tensors
        return None, None, None, None, *attention_backward.backward(do, q, k, v, o, lse, ctx.causal, ctx.scale)


_SoftmaxFunction = _lean_apply(SoftmaxFunction)
_CrossEntropyFunction = _lean_apply(CrossEntropyFunction)
_RMSNormFunction = _lean_apply(RMSNormFunction)
_LayerNormFunction = _lean_apply(LayerNormFunction)
_CrossEntropyLossFunction = _lean_apply(CrossEntropyLossFunction)
_AttentionFunction = _lean_apply(AttentionFunction)

RMSNORM_EPS = BUILTIN["rmsnorm"].scalars["eps"]
FUSED_IGNORE = BUILTIN["cross_entropy_fused_total"].scalars["ignore_index"]
LAYERNORM_EPS = BUILTIN["layernorm"].scalars["eps"]


# The C++ nodes take the differentiable calls (their gradient tests passed on the H100 through them,
# tests/test_autograd.py); LLMCOMPILE_NATIVE_AUTOGRAD=0 keeps the Python Functions.
NATIVE_NODES = os.environ.get("LLMCOMPILE_NATIVE_AUTOGRAD", "1") != "0"


def _nodes(*tensors: torch.Tensor) -> Any:
    """The C++ autograd nodes (`autograd_native`), or None where the Python Functions take the
    call: turned off (NATIVE_NODES), the extension is not built here, torch.compile traces,
    functorch transforms run, or an input is a functorch-wrapped tensor."""
    if not NATIVE_NODES or _is_compiling() or _functorch_active():
        return None
    for t in tensors:
        if _wrapped(t):
            return None
    return _native()


@functools.cache
def _native() -> Any:
    """The C++ nodes, or None. Once they are here, a public kernel function's call that wants grad
    goes from its C call straight to them (`grad_call`), not through its Python `__call__` and the
    wrappers below (on the CPU machine 1.5-2.7 us of a softmax's, 4.6-5 us of an rmsnorm's with eps
    by keyword). The routes are made by the first call that NATIVE_NODES lets reach here, and stay."""
    ext = autograd_native.module()
    if ext is not None:
        routes = (kernels.softmax, ext.SOFTMAX), (kernels.log_softmax, ext.LOG_SOFTMAX)
        routes += (kernels.rmsnorm, ext.RMSNORM), (kernels.layernorm, ext.LAYERNORM)
        for fn, op in routes:
            native_call.set_node(fn, ext.grad_call, op)
        # the attention's C call hands its calls with grad, and SDPA's 4-D ones without, to the node's
        # call (`attention_with`, which reads a model's v where it lies), not to Python
        for slot, fn in enumerate(kernels.ATTENTIONS):
            native_call.set_node(fn, ext.grad_call, ext.ATTENTION + slot, ndim=4)
    return ext


# softmax takes no scalars: a keyword given is refused here as on the lean call, not ignored
def softmax(x: torch.Tensor) -> torch.Tensor:
    if (ext := _nodes(x)) is not None:
        return ext.softmax(x, ext.SOFTMAX)
    return _SoftmaxFunction(x, False)


def log_softmax(x: torch.Tensor) -> torch.Tensor:
    if (ext := _nodes(x)) is not None:
        return ext.softmax(x, ext.LOG_SOFTMAX)
    return _SoftmaxFunction(x, True)


def cross_entropy(x: torch.Tensor, target: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    return _CrossEntropyFunction(x, target, int(ignore_index))


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = RMSNORM_EPS) -> torch.Tensor:
    if (ext := _nodes(x, weight)) is not None:
        return ext.rmsnorm(x, weight, float(eps))
    return _RMSNormFunction(x, weight, float(eps))


def layernorm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = LAYERNORM_EPS) -> torch.Tensor:
    if (ext := _nodes(x, weight, bias)) is not None:
        return ext.layernorm(x, weight, bias, float(eps))
    return _LayerNormFunction(x, weight, bias, float(eps))


def cross_entropy_loss(
    x: torch.Tensor, target: torch.Tensor, ignore_index: int = -100, reduction: str = "mean"
) -> torch.Tensor:
    """F.cross_entropy(x, target, ignore_index=..., reduction='mean' | 'sum') over the last dim,
    the gradient computed with the loss in one pass over the logits."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"cross_entropy_loss reduces by 'mean' or 'sum', not {reduction!r} (per row: cross_entropy)")
    if ignore_index == FUSED_IGNORE and (ext := _nodes(x)) is not None:  # (another goes to Python by keyword)
        # (with no gradient wanted, the loss alone: the call without dx)
        return ext.cross_entropy_loss(x, target, reduction == "mean", _one(x.device))
    if not (x.requires_grad and torch.is_grad_enabled()):  # no gradient wanted: the loss alone, one call
        # (rows as they come: the call takes leading dims, dense or not, and says what is wrong)
        x, target = (
            (x, target) if x.dim() == 2 and target.dim() == 1 else (x.reshape(-1, x.shape[-1]), target.reshape(-1))
        )
        outs = (
            kernels.cross_entropy_total(x, target)
            if ignore_index == FUSED_IGNORE
            else kernels.cross_entropy_total(x, target, ignore_index=int(ignore_index))
        )
        return outs[2 if reduction == "mean" else 1].view(())
    return _CrossEntropyLossFunction(x, target, int(ignore_index), reduction == "mean")


def attention(fn: Any, causal: bool, scale: float) -> Any:
    """The differentiable call of attention kernel function `fn` (its `grad_fn`): `scale` its
    default, the call's own by keyword."""

    def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **scalars: float) -> tuple:
        # (a scale by keyword, or another rank, takes the Python Function)
        if not scalars and q.dim() in (3, 4) and (ext := _nodes(q, k, v)) is not None:
            return ext.attention(fn, causal, scale, q, k, v)
        o, lse = _AttentionFunction(fn, causal, float(scalars.get("scale", scale)), scalars, q, k, v)
        return o, lse.detach()

    return call
