"""Differentiable calls: a torch.autograd.Function per op, its forward kernel saving what its
backward kernel needs (softmax's output y, cross-entropy's log-sum-exp).

`llmcompile.kernels.softmax(x)` comes here when x requires grad and grad mode is on, and takes
the lean call otherwise (`KernelFunction.grad_fn`). Under torch.compile the Functions are traced,
and the kernels inside them are the torch.library ops.
"""

from __future__ import annotations

from typing import Any

import torch


class SoftmaxFunction(torch.autograd.Function):
    """Softmax or log-softmax over the last dim: y saved, dx from (dy, y)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, log: bool) -> torch.Tensor:
        from llmcompile import kernels

        y = (kernels.log_softmax if log else kernels.softmax)(x)
        ctx.save_for_backward(y)
        ctx.log = log
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, None]:
        from llmcompile import kernels

        (y,) = ctx.saved_tensors
        bwd = kernels.log_softmax_bwd if ctx.log else kernels.softmax_bwd
        return bwd(dy.to(y.dtype), y), None


class CrossEntropyFunction(torch.autograd.Function):
    """Per-row cross-entropy (reduction 'none'): the forward also writes each row's lse; the
    backward reads the logits once more and writes dlogits."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, target: torch.Tensor, ignore_index: int) -> torch.Tensor:
        from llmcompile import kernels

        scalars = {} if ignore_index == -100 else {"ignore_index": ignore_index}
        loss, lse = kernels.cross_entropy_fwd(x, target, **scalars)
        ctx.save_for_backward(x, target, lse)
        ctx.scalars = scalars
        return loss

    @staticmethod
    def backward(ctx: Any, dloss: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        from llmcompile import kernels

        x, target, lse = ctx.saved_tensors
        return kernels.cross_entropy_bwd(x, target, lse, dloss.float(), **ctx.scalars), None, None


# softmax takes no scalars: a keyword given is refused here as on the lean call, not ignored
def softmax(x: torch.Tensor) -> torch.Tensor:
    return SoftmaxFunction.apply(x, False)


def log_softmax(x: torch.Tensor) -> torch.Tensor:
    return SoftmaxFunction.apply(x, True)


def cross_entropy(x: torch.Tensor, target: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    return CrossEntropyFunction.apply(x, target, int(ignore_index))
