"""attention_tf32: scaled_dot_product_attention of fp32 inputs with wide heads and short rows."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import fx

from llmcompile.agent.patterns.emit import lit
from llmcompile.agent.patterns.graph import Unsupported, results_of, split_nodes
from llmcompile.specs import OpSpec

_SDPA_DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}


def match_attention(spec: OpSpec, gm: fx.GraphModule, given: list, shapes: dict) -> dict | None:
    """`F.scaled_dot_product_attention(q, k, v)` of three (B, H, N, D) fp32 inputs, no mask:
    the fp32 attention kernel for wide heads (reference_kernels/attention_tf32.py)."""
    ph, calls, (out,) = split_nodes(gm)
    if len(calls) != 1 or calls[0].target is not F.scaled_dot_product_attention or results_of(out) != [calls[0]]:
        return None
    node = calls[0]
    if list(node.args[:3]) != ph or len(ph) != 3 or len(given) != 3:
        return None
    names = list(_SDPA_DEFAULTS)
    opts = {**_SDPA_DEFAULTS, **dict(zip(names, node.args[3:])), **node.kwargs}
    other = {k: v for k, v in opts.items() if k != "scale" and v != _SDPA_DEFAULTS[k]}
    shape = tuple(shapes[ph[0]])
    if other or not (opts["scale"] is None or isinstance(opts["scale"], (int, float))):
        raise Unsupported(f"`scaled_dot_product_attention` with {sorted(other) or ['a tensor scale']}")
    from reference_kernels.attention_tf32 import check_shape

    why = check_shape(shape[-2], shape[-1]) if len(shape) == 4 else "inputs of rank 4"
    if any(tuple(shapes[n]) != shape for n in ph) or any(g.dtype != torch.float32 for g in given) or why:
        raise Unsupported(
            f"`scaled_dot_product_attention` of {[tuple(shapes[n]) for n in ph]} (the fp32 kernel takes {why or 'three equal fp32 shapes'})"
        )
    scale = 1.0 / math.sqrt(shape[-1]) if opts["scale"] is None else float(opts["scale"])
    return {
        "what": f"softmax attention over {shape[2]} keys, head dim {shape[3]}, fp32 (TF32 tensor cores)",
        "scale": lit(scale),
        "ins": [t.name for t in spec.tensors[:3]],
    }
