"""pool: max and average pooling modules over 1-3 spatial dims."""

from __future__ import annotations

from torch import fx, nn

from llmcompile.agent.patterns.graph import Unsupported, only_module
from llmcompile.specs import OpSpec

_POOL_MODULES = {
    nn.MaxPool1d: ("max", 1),
    nn.MaxPool2d: ("max", 2),
    nn.MaxPool3d: ("max", 3),
    nn.AvgPool1d: ("avg", 1),
    nn.AvgPool2d: ("avg", 2),
    nn.AvgPool3d: ("avg", 3),
}


def match_pool(spec: OpSpec, gm: fx.GraphModule, given: list, shapes: dict) -> dict | None:
    """A max or average pooling module applied to the one input."""
    only = only_module(gm, 1)
    if only is None or type(only[1]) not in _POOL_MODULES:
        return None
    ph, mod = only
    kind, dims = _POOL_MODULES[type(mod)]
    name = type(mod).__name__
    shape = tuple(shapes[ph[0]])
    if len(shape) != dims + 2:
        raise Unsupported(f"`{name}` of an input {shape} (the template takes (N, C, *spatial))")
    if getattr(mod, "ceil_mode", False) or getattr(mod, "return_indices", False):
        raise Unsupported(f"`{name}` with ceil_mode or return_indices")
    window = {k: getattr(mod, k) for k in ("kernel_size", "stride", "padding")}
    window = {k: tuple(v) if isinstance(v, (list, tuple)) else v for k, v in window.items()}
    what = f"{kind} pooling over {dims}-D windows {window['kernel_size']}, stride {window['stride']}"
    return {
        "what": what,
        "kind": kind,
        "kernel": window["kernel_size"],
        "stride": window["stride"],
        "padding": window["padding"],
        "dilation": getattr(mod, "dilation", 1),
        "count_include_pad": bool(getattr(mod, "count_include_pad", True)),
        "divisor_override": getattr(mod, "divisor_override", None),
        "x": spec.tensors[0].name,
    }
