"""Other implementations of each op, timed beside ours: torch eager, torch.compile, QuACK, Liger;
for attention, each backend of torch's scaled_dot_product_attention and flash-attn-4.

Each factory takes the op's inputs (in spec order) and scalars and returns a zero-argument
callable, or raises `Unavailable` when that implementation cannot run the op here.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from llmcompile.specs import OpError, OpSpec


class Unavailable(Exception):
    pass


def _torch_fn(spec: OpSpec) -> Callable[..., object]:
    if spec.torch_fn is None:
        raise Unavailable(f"{spec.name} has no torch expression")
    return spec.torch_fn


def eager(spec: OpSpec, inputs: list[torch.Tensor], scalars: dict) -> Callable[[], object]:
    fn = _torch_fn(spec)
    return lambda: fn(*inputs, *scalars.values())


def compiled(spec: OpSpec, inputs: list[torch.Tensor], scalars: dict) -> Callable[[], object]:
    """torch.compile(dynamic=False), compiled afresh for this shape."""
    torch._dynamo.reset()
    fn = torch.compile(_torch_fn(spec), dynamic=False)
    return lambda: fn(*inputs, *scalars.values())


def quack(spec: OpSpec, inputs: list[torch.Tensor], scalars: dict) -> Callable[[], object]:
    try:
        import quack as q
        from quack.cross_entropy import cross_entropy_bwd, cross_entropy_fwd
        from quack.rmsnorm import layernorm_bwd, layernorm_fwd, rmsnorm_bwd, rmsnorm_fwd
        from quack.softmax import softmax_bwd
    except Exception as e:  # noqa: BLE001 - any import failure means "not here"
        raise Unavailable(f"quack not importable: {type(e).__name__}") from None
    op, x = spec.name, inputs[0]
    if op == "softmax":
        return lambda: q.softmax(x)
    if op == "softmax_bwd":
        return lambda: softmax_bwd(x, inputs[1])
    if op in ("rmsnorm", "rmsnorm_fwd"):
        w = inputs[1].float()  # QuACK's norms take fp32 weights
        if op == "rmsnorm_fwd":
            return lambda: rmsnorm_fwd(x, w, eps=scalars["eps"], store_rstd=True)
        return lambda: q.rmsnorm(x, w, eps=scalars["eps"])
    if op == "rmsnorm_bwd":  # (dy, x, w, rstd): dx, and dw summed from its per-CTA partials
        dy, xx, w, rstd = inputs[0], inputs[1], inputs[2].float(), inputs[3]
        return lambda: rmsnorm_bwd(xx, w, dy, rstd)
    if op in ("layernorm", "layernorm_fwd"):
        w, b = inputs[1].float(), inputs[2].float()
        stats = {"return_rstd": True, "return_mean": True} if op == "layernorm_fwd" else {}
        return lambda: layernorm_fwd(x, w, b, eps=scalars["eps"], **stats)
    if op == "layernorm_bwd":  # (dy, x, w, mean, rstd)
        dy, xx, w, mean, rstd = inputs[0], inputs[1], inputs[2].float(), inputs[3], inputs[4]
        return lambda: layernorm_bwd(xx, w, dy, rstd, mean)
    if op in ("cross_entropy", "cross_entropy_fwd"):
        t, lse = inputs[1], op == "cross_entropy_fwd"
        return lambda: cross_entropy_fwd(x, t, ignore_index=scalars["ignore_index"], return_lse=lse)
    if op == "cross_entropy_bwd":  # (x, target, lse, dloss)
        t, lse, dloss = inputs[1], inputs[2], inputs[3]
        return lambda: cross_entropy_bwd(x, t, dloss, lse, ignore_index=scalars["ignore_index"])
    if op == "cross_entropy_fused":  # the loss and dlogits (dloss = 1 a row) from one read
        t = inputs[1]
        return lambda: cross_entropy_fwd(x, t, ignore_index=scalars["ignore_index"], return_dx=True)
    raise Unavailable(f"QuACK has no {op}")


def liger(spec: OpSpec, inputs: list[torch.Tensor], scalars: dict) -> Callable[[], object]:
    try:
        from liger_kernel.transformers import functional as lf
    except Exception as e:  # noqa: BLE001
        raise Unavailable(f"liger not importable: {type(e).__name__}") from None
    op, x = spec.name, inputs[0]
    if op == "softmax":
        return lambda: lf.liger_softmax(x)
    if op == "rmsnorm":
        return lambda: lf.liger_rms_norm(x, inputs[1], scalars["eps"], in_place=False)
    if op == "layernorm":
        return lambda: lf.liger_layer_norm(x, inputs[1], inputs[2], scalars["eps"])
    if op == "cross_entropy":
        return lambda: lf.liger_cross_entropy(x, inputs[1], ignore_index=scalars["ignore_index"], reduction="none")
    if op == "rmsnorm_bwd":  # (dy, x, w, rstd): Liger's backward, as its autograd Function calls it
        from liger_kernel.ops.rms_norm import rms_norm_backward
        from liger_kernel.ops.utils import calculate_settings

        block, warps = calculate_settings(x.shape[-1])
        dy, xx, w, rstd = inputs
        return lambda: rms_norm_backward(dy, xx, w, rstd, 0.0, "llama", block, warps, False, None)
    if op == "layernorm_bwd":  # (dy, x, w, mean, rstd); db needs only the bias's shape
        from liger_kernel.ops.layer_norm import layer_norm_backward

        dy, xx, w, mean, rstd = inputs
        return lambda: layer_norm_backward(dy, xx, w, w, mean, rstd)
    if op == "cross_entropy_fused":
        # Liger's forward with a logits tensor that requires grad: the loss, and dlogits written
        # over the logits (its memory-saving trick; timing rewrites the inputs with gradients)
        from liger_kernel.ops.cross_entropy import cross_entropy_forward

        xg, t = x.detach().requires_grad_(), inputs[1]
        return lambda: cross_entropy_forward(xg, t, None, scalars["ignore_index"], 0.0, 0.0, "mean", None, False)
    raise Unavailable(f"Liger has no {op}")


def _attention_args(spec: OpSpec, inputs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    if spec.flops is None or not spec.name.startswith("attention"):
        raise Unavailable(f"{spec.name} is not attention")
    return tuple(inputs[:3])


def _sdpa(backend_name: str) -> Callable[[OpSpec, list[torch.Tensor], dict], Callable[[], object]]:
    """torch's scaled_dot_product_attention held to one backend: (M, N, D) seen as one batch
    of M heads. What a backend cannot take (a head dim, a dtype) fails when timed, and is
    reported there."""

    def make(spec: OpSpec, inputs: list[torch.Tensor], scalars: dict) -> Callable[[], object]:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        q, k, v = (t.unsqueeze(0) for t in _attention_args(spec, inputs))
        backend = getattr(SDPBackend, backend_name)
        causal = "causal" in spec.name

        def call() -> object:
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scalars["scale"])

        return call

    return make


def flash_attn_4(spec: OpSpec, inputs: list[torch.Tensor], scalars: dict) -> Callable[[], object]:
    """flash-attn-4 (CuTe DSL): (B, S, H, D) inputs, made once here from ours, outside the timing."""
    q, k, v = _attention_args(spec, inputs)
    try:
        from flash_attn.cute import flash_attn_func
    except Exception as e:  # noqa: BLE001
        raise Unavailable(f"flash-attn-4 not importable: {type(e).__name__}") from None
    qb, kb, vb = (t.unsqueeze(0).transpose(1, 2).contiguous() for t in (q, k, v))
    causal = "causal" in spec.name
    return lambda: flash_attn_func(qb, kb, vb, softmax_scale=scalars["scale"], causal=causal)


BASELINES: dict[str, Callable[[OpSpec, list[torch.Tensor], dict], Callable[[], object]]] = {
    "eager": eager,
    "compile": compiled,
    "quack": quack,
    "liger": liger,
    "sdpa_flash": _sdpa("FLASH_ATTENTION"),
    "sdpa_cudnn": _sdpa("CUDNN_ATTENTION"),
    "sdpa_efficient": _sdpa("EFFICIENT_ATTENTION"),
    "fa4": flash_attn_4,
}


def parse_baselines(text: str) -> list[str]:
    """A comma list of baseline names ('' or 'none': none), each one known."""
    names = [] if text in ("", "none") else text.split(",")
    if unknown := [b for b in names if b not in BASELINES]:
        raise OpError(f"unknown baseline {', '.join(unknown)}; known: {', '.join(BASELINES)}")
    return names
