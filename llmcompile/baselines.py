"""Other implementations of each op, timed beside ours: torch eager, torch.compile, QuACK, Liger.

Each factory takes the op's inputs (in spec order) and scalars and returns a zero-argument
callable, or raises `Unavailable` when that implementation cannot run the op here.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from llmcompile.ops import OpSpec


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
        from quack.cross_entropy import cross_entropy_fwd
        from quack.rmsnorm import layernorm_fwd
    except Exception as e:  # noqa: BLE001 - any import failure means "not here"
        raise Unavailable(f"quack not importable: {type(e).__name__}") from None
    op, x = spec.name, inputs[0]
    if op == "softmax":
        return lambda: q.softmax(x)
    if op == "rmsnorm":
        w = inputs[1].float()  # QuACK's norms take fp32 weights
        return lambda: q.rmsnorm(x, w, eps=scalars["eps"])
    if op == "layernorm":
        w, b = inputs[1].float(), inputs[2].float()
        return lambda: layernorm_fwd(x, w, b, eps=scalars["eps"])
    if op == "cross_entropy":
        t = inputs[1]
        return lambda: cross_entropy_fwd(x, t, ignore_index=scalars["ignore_index"])
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
    raise Unavailable(f"Liger has no {op}")


BASELINES: dict[str, Callable[[OpSpec, list[torch.Tensor], dict], Callable[[], object]]] = {
    "eager": eager,
    "compile": compiled,
    "quack": quack,
    "liger": liger,
}
