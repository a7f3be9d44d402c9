"""Differentiable calls: a torch.autograd.Function per op, its forward kernel saving what its
backward kernel needs (softmax's output y, cross-entropy's log-sum-exp, a norm's rstd and mean).

`llmcompile.kernels.softmax(x)` comes here when an input requires grad and grad mode is on, and takes
the lean call otherwise (`KernelFunction.grad_fn`). Under torch.compile the Functions are traced,
and the kernels inside them are the torch.library ops.
"""

from __future__ import annotations

from typing import Any

import torch

from llmcompile.runtime import compiled as kernels
from llmcompile.specs import BUILTIN


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
        bwd = kernels.log_softmax_bwd if ctx.log else kernels.softmax_bwd
        # (an upstream gradient from .sum() arrives expanded, stride 0: the kernel reads rows)
        return bwd(dy.to(y.dtype).contiguous(), y), None


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
        # loss.sum().backward() hands dloss expanded from one value (stride 0): made a vector of
        # M floats here, the call is the fast one at once, not a refusal in C and a dense copy
        # after it (before that copy existed, the checked path: 396 us against 89 at 32768 x 512
        # bf16 on the H100, issue 47)
        return kernels.cross_entropy_bwd(x, target, lse, dloss.float().contiguous(), **ctx.scalars), None, None


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    return t.reshape(-1, n).contiguous()


class RMSNormFunction(torch.autograd.Function):
    """RMSNorm over the last dim (leading dims flattened into rows): rstd saved; dx and dw
    (summed over rows, deterministically) from (dy, x, w, rstd)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x2 = _rows(x, x.shape[-1])
        out, rstd = kernels.rmsnorm_fwd(x2, weight, **_given("rmsnorm_fwd", eps=eps))
        ctx.save_for_backward(x2, weight, rstd)
        ctx.shape = x.shape
        return out.view(x.shape)

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x2, weight, rstd = ctx.saved_tensors
        dx, dw = kernels.rmsnorm_bwd(_rows(dout.to(x2.dtype), x2.shape[1]), x2, weight, rstd)
        return dx.view(ctx.shape), dw, None


class LayerNormFunction(torch.autograd.Function):
    """LayerNorm over the last dim: mean and rstd saved; dx, dw and db from (dy, x, w, mean, rstd)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
        x2 = _rows(x, x.shape[-1])
        out, mean, rstd = kernels.layernorm_fwd(x2, weight, bias, **_given("layernorm_fwd", eps=eps))
        ctx.save_for_backward(x2, weight, mean, rstd)
        ctx.shape = x.shape
        return out.view(x.shape)

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:
        x2, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = kernels.layernorm_bwd(_rows(dout.to(x2.dtype), x2.shape[1]), x2, weight, mean, rstd)
        return dx.view(ctx.shape), dw, db, None


class CrossEntropyLossFunction(torch.autograd.Function):
    """The mean (or sum) of cross-entropy over rows, its gradient written in the forward pass
    (`cross_entropy_fused`): the logits are read once and not kept for the backward, so they
    may be freed as soon as the loss is computed (Liger's and QuACK's memory-saving trick)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, target: torch.Tensor, ignore_index: int, mean: bool) -> torch.Tensor:
        n = x.shape[-1]
        x2, t = _rows(x, n), target.reshape(-1)
        # the upstream gradient of each row's loss, on the device: nobody waits for the count
        kept = (t != ignore_index).sum().clamp(min=1).float()
        scale = (1.0 / kept if mean else torch.ones((), device=x.device)).reshape(1)
        loss, dx = kernels.cross_entropy_fused(x2, t, scale, **_given("cross_entropy_fused", ignore_index=ignore_index))
        ctx.save_for_backward(dx)
        ctx.shape = x.shape
        return loss.sum() * scale[0]

    @staticmethod
    def backward(ctx: Any, dloss: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        (dx,) = ctx.saved_tensors
        # dx is the gradient for an upstream 1 (`loss.backward()`); another costs one more pass
        # over dx, and finding out which costs a host sync, as in Liger
        if not torch.equal(dloss, torch.ones_like(dloss)):
            dx = dx * dloss.to(dx.dtype)
        return dx.view(ctx.shape), None, None, None


RMSNORM_EPS = BUILTIN["rmsnorm"].scalars["eps"]
LAYERNORM_EPS = BUILTIN["layernorm"].scalars["eps"]


# softmax takes no scalars: a keyword given is refused here as on the lean call, not ignored
def softmax(x: torch.Tensor) -> torch.Tensor:
    return SoftmaxFunction.apply(x, False)


def log_softmax(x: torch.Tensor) -> torch.Tensor:
    return SoftmaxFunction.apply(x, True)


def cross_entropy(x: torch.Tensor, target: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    return CrossEntropyFunction.apply(x, target, int(ignore_index))


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = RMSNORM_EPS) -> torch.Tensor:
    return RMSNormFunction.apply(x, weight, float(eps))


def layernorm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = LAYERNORM_EPS) -> torch.Tensor:
    return LayerNormFunction.apply(x, weight, bias, float(eps))


def cross_entropy_loss(
    x: torch.Tensor, target: torch.Tensor, ignore_index: int = -100, reduction: str = "mean"
) -> torch.Tensor:
    """F.cross_entropy(x, target, ignore_index=..., reduction='mean' | 'sum') over the last dim,
    the gradient computed with the loss in one pass over the logits."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"cross_entropy_loss reduces by 'mean' or 'sum', not {reduction!r} (per row: cross_entropy)")
    if not (x.requires_grad and torch.is_grad_enabled()):  # no gradient wanted: the loss alone
        t = target.reshape(-1)
        scalars = _given("cross_entropy", ignore_index=int(ignore_index))
        total = kernels.cross_entropy(_rows(x, x.shape[-1]), t, **scalars).sum()
        return total / (t != ignore_index).sum().clamp(min=1) if reduction == "mean" else total
    return CrossEntropyLossFunction.apply(x, target, int(ignore_index), reduction == "mean")
