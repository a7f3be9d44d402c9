"""The attention's backward, which we have no kernel for yet: torch's own attention backward kernel
fed the o and natural-log log-sum-exp our forward kernel wrote (`autograd.attention`).

q, k, v and o are (batch x heads, sequence, head dim), seen by torch as one batch of that many
heads, or (batch, heads, sequence, head dim) as SDPA's; dense (the forward made them so). The
kernel is the one torch's SDPA picks for them: cuDNN's, which reads o laid out as q (given another
layout, its gradients were off by 7 on an H200), or flash-attention's. Where SDPA would pick
neither (another backend, or one turned off by `torch.nn.attention.sdpa_kernel`), or off the GPU,
the gradients SDPA's math path computes, from the scores made again in fp32 (or float64): slower,
and as much memory as that path. `route` says which; the C++ attention node (autograd_nodes.cpp)
calls cuDNN's or flash-attention's kernel itself, and `backward` for the math path.
"""

from __future__ import annotations

import functools

import torch
from torch.nn.attention import SDPBackend

CUDNN, FLASH = SDPBackend.CUDNN_ATTENTION.value, SDPBackend.FLASH_ATTENTION.value
_PICKED: dict[tuple, int] = {}


def backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float) -> int:
    """The backend SDPA picks for 4-D q, k, v laid out as these (an SDPBackend value), asked once a
    layout and set of enabled backends: `_fused_sdp_choice` checks each backend's conditions, host
    time every backward would repeat."""
    cuda = torch.backends.cuda
    key = (q.shape, q.stride(), k.stride(), v.stride(), q.dtype, q.device, causal, scale)
    key += (cuda.cudnn_sdp_enabled(), cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled())
    if (picked := _PICKED.get(key)) is None:
        if len(_PICKED) >= 64:  # (a model runs a few shapes, not one a call)
            _PICKED.clear()
        picked = _PICKED[key] = torch._fused_sdp_choice(q, k, v, is_causal=causal, scale=scale)
    return picked


@functools.cache
def _extras(kind: str, device: torch.device) -> tuple:
    """What torch's forward of `kind` hands its backward besides o and lse (no sequence offsets, its
    dropout state, the rank of its lse), from one tiny call, so our forward feeds that backward as
    torch's own would."""
    q = torch.zeros(1, 1, 64, 64, device=device, dtype=torch.bfloat16)
    if kind == "cudnn":
        r = torch.ops.aten._scaled_dot_product_cudnn_attention(q, q, q, None, True, 0.0, True)
    else:
        r = torch.ops.aten._scaled_dot_product_flash_attention(q, q, q, 0.0, True)
    return r[2], r[3], r[6], r[7], r[1].dim()  # (both return o, lse, offsets, sizes, rng state, ...)


PYTHON = SDPBackend.MATH.value  # (a route: `backward` below, through Python)


def route(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, causal: bool, scale: float
) -> tuple:  # fmt: skip
    """How the backward of 4-D q, k, v and o runs: (CUDNN or FLASH, cum_q, cum_k, seed, offset, the
    rank of that backend's lse), torch's kernel fed as its own forward would; or (PYTHON,), SDPA's
    math path in `backward`. The C++ attention node (autograd_nodes.cpp) asks it once a layout and
    set of enabled backends, and calls the kernel itself."""
    if q.is_cuda:
        picked = backend(q, k, v, causal, scale)
        if picked == CUDNN and o.stride() == q.stride():
            return (CUDNN, *_extras("cudnn", q.device))
        if picked == FLASH:
            return (FLASH, *_extras("flash", q.device))
    return (PYTHON,)


def backward(
    do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
    causal: bool, scale: float,
) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """dq, dk, dv of the attention o = softmax(q k^T * scale) v over (M, N, D) tensors and lse (M, N),
    or SDPA's (B, H, N, D) and (B, H, N), in the inputs' shapes. do as the caller's graph made it (a
    model's is often a transposed view: torch's kernels read it so, a reshape would copy it)."""
    n = q.shape[-2]
    if q.is_cuda and q.dim() in (3, 4):
        four = q.dim() == 4
        q4, k4, v4, o4, do4 = (t if four else t.unsqueeze(0) for t in (q, k, v, o, do))
        lse3 = lse if four else lse.unsqueeze(0)
        kind, *extras = route(q4, k4, v4, o4, causal, scale)
        grads = None
        if kind == CUDNN:
            cum_q, cum_k, seed, offset, dims = extras
            lse3 = lse3.view(*lse3.shape, *[1] * (dims - 3))  # (cuDNN's is (b, h, s, 1))
            grads = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
                do4, q4, k4, v4, o4, lse3, seed, offset, None, cum_q, cum_k, n, n, 0.0, causal, scale=scale
            )
        elif kind == FLASH:
            cum_q, cum_k, seed, offset, _ = extras
            grads = torch.ops.aten._scaled_dot_product_flash_attention_backward(
                do4, q4, k4, v4, o4, lse3, cum_q, cum_k, n, n, 0.0, causal, seed, offset, scale=scale
            )
        if grads is not None:
            return tuple(g.reshape(t.shape) for g, t in zip(grads[:3], (q, k, v)))
    # what SDPA's math backward computes, from our o and lse, in torch ops (torch.compile traces them)
    f = torch.promote_types(q.dtype, torch.float32)
    qf, kf, vf, of, dof = (t.to(f) for t in (q, k, v, o, do))
    s = qf @ kf.transpose(-1, -2) * scale
    if causal:
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    p = torch.exp(s - lse.to(f)[..., None])
    ds = p * (dof @ vf.transpose(-1, -2) - (dof * of).sum(-1, keepdim=True)) * scale
    return tuple(g.to(q.dtype) for g in (ds @ kf, ds.transpose(-1, -2) @ qf, p.transpose(-1, -2) @ dof))
