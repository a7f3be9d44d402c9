"""scan: one cumsum, cumprod, logcumsumexp, cummax or cummin (its values) along one dim,
reversed, exclusive, or with a prologue: the last dim's on scan.RowScan, another's on
scan_columns.ColumnScan."""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
from torch import fx

from llmcompile.agent.patterns.emit import Emitter, lit
from llmcompile.agent.patterns.graph import (
    SCANS,
    Unsupported,
    one_result,
    op_of,
    param_names,
    split_nodes,
    under_views,
)
from llmcompile.specs import OpSpec
from llmcompile.specs.contract import MAX_WORKSPACE

# each scan's associative combine (reference_kernels/scan.py) and its identity
COMBINES = {
    "cumsum": ("S.add", 0.0),
    "cumprod": ("S.mul", 1.0),
    "logcumsumexp": ("S.log_add_exp", -math.inf),
    "cummax": ("S.fmax", -math.inf),
    "cummin": ("S.fmin", math.inf),
}
PAIRED_SCANS = ("cummax", "cummin")


def match_scan(spec: OpSpec, gm: fx.GraphModule, given: list, shapes: dict) -> dict | None:
    ph, calls, (out,) = split_nodes(gm)
    ops = {n: op_of(gm, n) for n in calls}
    scans = [op for op in ops.values() if op.kind in SCANS]
    if len(scans) != 1:
        return None
    sc = scans[0]

    def arg(node: fx.Node, i: int, name: str, default: Any = None) -> Any:
        return ops[node].kw.get(name, ops[node].args[i] if len(ops[node].args) > i else default)

    dim = arg(sc.node, 1, "dim")
    src = sc.args[0]
    rank = len(shapes[src])
    if not isinstance(dim, int) or not -rank <= dim < rank:
        raise Unsupported(f"a scan along dim {dim} of a rank-{rank} tensor")
    d = dim % rank
    last = d == rank - 1
    res = one_result(out, "scan")
    top = sc.node  # (the scan's values: cummax's and cummin's are their [0], or .values)
    if sc.kind in PAIRED_SCANS:
        if [(u.target, u.args[1:]) for u in sc.node.users] != [(operator.getitem, (0,))]:
            raise Unsupported(f"`{sc.kind}` whose indices are read (the scan template writes its values)")
        (top,) = sc.node.users
    # (returned reshaped: the kernel reads the scan's length from the output's last dim, so one
    # that keeps it, x.view(-1, N) scanned, is the same rows)
    if last and isinstance(res, fx.Node) and res in shapes and tuple(shapes[res][-1:]) == tuple(shapes[top][-1:]):
        res, _ = under_views(gm, res)
    reverse = exclusive = False

    def is_scan_flip(node: Any) -> bool:
        if not isinstance(node, fx.Node) or node not in ops or ops[node].kind != "flip":
            return False
        dims = arg(node, 1, "dims")
        dims = [dims] if isinstance(dims, int) else list(dims or [])
        return [x % rank for x in dims] == [d]

    if is_scan_flip(res) and is_scan_flip(src):
        reverse, res, src = True, res.args[0], src.args[0]
    if isinstance(res, fx.Node) and res in ops and ops[res].kind == "cat" and arg(res, 1, "dim", 0) % rank == d:
        parts = ops[res].args[0]
        if (
            len(parts) == 2
            and ops.get(parts[0]) is not None
            and ops[parts[0]].kind == "zeros_like"
            and tuple(shapes[parts[0]]) == tuple(shapes[src][:d]) + (1,) + tuple(shapes[src][d + 1 :])
            and parts[1] is top
            and src in ops
            and ops[src].kind == "narrow"
            and arg(src, 1, "dim") % rank == d
        ):
            nw = ops[src]
            start = arg(src, 2, "start")
            length = arg(src, 3, "length")
            if start == 0 and length == shapes[nw.args[0]][d] - 1:  # (x.size(d) - 1, folded: graph.fold_shape_reads)
                if COMBINES[sc.kind][1] != 0.0:  # (the kernel writes the identity first, torch the zeros)
                    raise Unsupported(
                        f"an exclusive `{sc.kind}` led by zeros (the scan template leads with its identity)"
                    )
                exclusive, res, src = True, top, nw.args[0]
    if res is not top:
        return None
    # every input read at the output's flat offsets: one of another size (broadcast against the
    # scanned tensor, or reduced before it) would be read past its end
    scanned = tuple(shapes[src])
    for g in given:
        if isinstance(g, torch.Tensor) and g.numel() != math.prod(scanned):
            raise Unsupported(
                f"a scan over {scanned} of an input of {tuple(g.shape)} (the scan templates read each input"
                " where they write: one broadcast or reduced first is not)"
            )
    inner = math.prod(scanned[d + 1 :])
    _, tensors, _ = param_names(spec, given, ph)
    pro_env = {}
    # input i's element is v[i]; masks arrive as Boolean elements: multiply by them through a select
    for i, (n, g) in enumerate((n, g) for n, g in zip(ph, given) if isinstance(g, torch.Tensor)):
        pro_env[n] = (
            f"cutlass.select_(v[{i}], Float32(1.0), Float32(0.0))" if g.dtype == torch.bool else f"Float32(v[{i}])"
        )
    pro = Emitter(gm, pro_env, vector=False).expr(src)
    combine, identity = COMBINES[sc.kind]
    return {
        "combine": combine,
        "identity": lit(identity),
        "prologue": pro,
        "reverse": reverse,
        "exclusive": exclusive,
        "inputs": tensors,
        "kind": sc.kind,
        "dim": None if last else d,
        # the batch dim's segments' totals (scan_columns.workspace_elems), where two fit the contract
        "workspace": f"C.workspace_elems({inner})" if d == 0 and not last and 2 * inner <= MAX_WORKSPACE else "",
    }
