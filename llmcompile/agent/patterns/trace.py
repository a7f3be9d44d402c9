"""The front end's steps, in order: a problem's model traced with torch.fx, its shape reads made
constants, torch's shorthands written out, repeats merged, then, with the graph's shapes, views
that merge x's dims lifted to x's own dims and the idioms written by hand folded."""

from __future__ import annotations

import torch
from torch import fx
from torch.fx.passes.shape_prop import ShapeProp

from llmcompile.agent.patterns.decompose import Refused, decompose
from llmcompile.agent.patterns.graph import Unsupported, fold_shape_reads, merge_repeats
from llmcompile.agent.patterns.idioms import fold_idioms
from llmcompile.agent.patterns.lift import lift_views
from llmcompile.specs import OpSpec
from llmcompile.specs.kernelbench import model_of


def trace(spec: OpSpec) -> tuple[fx.GraphModule, list, dict[fx.Node, torch.Size]]:
    """The problem's graph as the matchers read it, its inputs as given, and each node's shape."""
    model, given = model_of(spec)
    try:
        gm = fx.symbolic_trace(model)
    except Exception as e:  # noqa: BLE001 - data-dependent control flow, etc.
        raise Unsupported(f"torch.fx cannot trace the model ({type(e).__name__}: {e})") from None
    try:
        fold_shape_reads(gm, spec, given)
        decompose(gm)
    except Refused as e:
        raise Unsupported(str(e)) from None
    merge_repeats(gm)
    try:
        ShapeProp(gm).propagate(*given)
        for fold in (lift_views, fold_idioms):
            if fold(gm):  # (its new nodes' shapes)
                ShapeProp(gm).propagate(*given)
    except Exception as e:  # noqa: BLE001
        raise Unsupported(f"shapes do not propagate on the meta device ({type(e).__name__}: {e})") from None
    shapes = {n: tm.shape for n in gm.graph.nodes if hasattr(tm := n.meta.get("tensor_meta"), "shape")}
    return gm, given, shapes
