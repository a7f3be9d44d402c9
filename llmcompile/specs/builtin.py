"""The built-in ops, by name (`BUILTIN`): the row ops, their backwards and the fused
cross-entropy, each with its reference kernel, and the attention ops."""

from __future__ import annotations

import dataclasses

import torch

from llmcompile.specs.attention import attention_spec
from llmcompile.specs.inputs import (
    IGNORE_CASE,
    ce_bwd_inputs,
    ce_fused_inputs,
    ce_inputs,
    norm_bwd_inputs,
    norm_inputs,
    scale_inputs,
    softmax_bwd_inputs,
    softmax_inputs,
)
from llmcompile.specs.references import (
    ref_copy,
    ref_cross_entropy,
    ref_cross_entropy_bwd,
    ref_cross_entropy_fused,
    ref_cross_entropy_fused_total,
    ref_cross_entropy_fwd,
    ref_cross_entropy_total,
    ref_layernorm,
    ref_layernorm_bwd,
    ref_layernorm_fwd,
    ref_log_softmax,
    ref_log_softmax_bwd,
    ref_rmsnorm,
    ref_rmsnorm_bwd,
    ref_rmsnorm_fwd,
    ref_scale,
    ref_softmax,
    ref_softmax_bwd,
    t_cross_entropy,
    t_cross_entropy_bwd,
    t_cross_entropy_fused,
    t_cross_entropy_fused_total,
    t_cross_entropy_fwd,
    t_cross_entropy_total,
    t_layernorm,
    t_layernorm_bwd,
    t_layernorm_fwd,
    t_log_softmax_bwd,
    t_rmsnorm,
    t_rmsnorm_bwd,
    t_rmsnorm_fwd,
    t_scale,
    t_softmax_bwd,
)
from llmcompile.specs.types import DEFAULT_TOL, DTYPES, OpSpec, TensorDesc, Tolerance


def _softmax_bwd_spec(log: bool) -> OpSpec:
    name = "log_softmax_bwd" if log else "softmax_bwd"
    row = ("M", "N")
    return OpSpec(
        name,
        f"{name[:-4].replace('_', '-')} backward over the last dim, from the forward's output y",
        (TensorDesc("dy", row), TensorDesc("y", row), TensorDesc("dx", row, output=True)),
        ref_log_softmax_bwd if log else ref_softmax_bwd,
        softmax_bwd_inputs(log),
        cases=("random", "peaked", "large"),
        reference_module=name,
        torch_expr=(
            "dx = dy - torch.exp(y) * dy.sum(-1, keepdim=True)"
            if log
            else "dx = y * (dy - (dy * y).sum(-1, keepdim=True))"
        ),
        torch_fn=t_log_softmax_bwd if log else t_softmax_bwd,
    )


# eps large enough to move every output (rsqrt(1 + 0.5) against rsqrt(1)); the cross-entropy ops
# with 30% of their targets at IGNORE_CASE and that as ignore_index
EPS_CASES = (("random", {"eps": 0.5}),)
IGNORE_CASES = (("ignore_7", {"ignore_index": IGNORE_CASE}),)
# every cross-entropy op's scalar and the value cases it is verified on (ignored rows among them)
_CE_CASES = {
    "scalars": {"ignore_index": -100},
    "scalar_cases": IGNORE_CASES,
    "cases": ("random", "large", "ignore_index"),
}

_X = TensorDesc("x", ("M", "N"))
_OUT = TensorDesc("out", ("M", "N"), output=True)
_W = TensorDesc("weight", ("N",))
_DY = TensorDesc("dy", ("M", "N"))
_DX = TensorDesc("dx", ("M", "N"), output=True)
# a loss's rows (logits, targets, each row's loss), then its sum, mean over the kept rows and 1/kept,
# each one fp32 value
_CE_ROWS = (_X, TensorDesc("target", ("M",), "int64"), TensorDesc("loss", ("M",), "float32", output=True))
_TOTALS = tuple(TensorDesc(name, ("1",), "float32", output=True) for name in ("sum", "mean", "inv_kept"))
_TOTALS_EXPR = (
    "kept = (target != ignore_index).sum().clamp(min=1); sum = loss.sum(); mean = sum / kept; inv_kept = 1 / kept"
)
_ONE_DY = TensorDesc("dy", ("1",))  # an upstream gradient of one value everywhere, in x's dtype


def _STAT(name: str, output: bool = True) -> TensorDesc:  # noqa: N802 - a descriptor maker beside _X, _OUT
    return TensorDesc(name, ("M",), "float32", output=output)


BUILTIN: dict[str, OpSpec] = {
    s.name: s
    for s in (
        OpSpec(
            "copy",
            "out = x: the memory speed-of-light probe",
            (_X, _OUT),
            ref_copy,
            softmax_inputs,
            tolerance={d: Tolerance(0.0, 0.0) for d in DTYPES},
            reference_module="copy",
            torch_expr="out = x.clone()",
            torch_fn=torch.clone,
        ),
        OpSpec(
            "softmax",
            "softmax over the last dim",
            (_X, _OUT),
            ref_softmax,
            softmax_inputs,
            cases=("random", "large", "neg_inf", "shifted"),
            reference_module="softmax",
            torch_expr="out = torch.softmax(x, dim=-1)",
            torch_fn=lambda x: torch.softmax(x, dim=-1),
        ),
        OpSpec(
            "log_softmax",
            "log-softmax over the last dim",
            (_X, _OUT),
            ref_log_softmax,
            softmax_inputs,
            cases=("random", "large", "neg_inf", "shifted"),
            reference_module="log_softmax",
            torch_expr="out = torch.log_softmax(x, dim=-1)",
            torch_fn=lambda x: torch.log_softmax(x, dim=-1),
        ),
        OpSpec(
            "rmsnorm",
            "RMSNorm over the last dim, with weight",
            (_X, TensorDesc("weight", ("N",)), _OUT),
            ref_rmsnorm,
            norm_inputs(False),
            scalars={"eps": 1e-6},
            scalar_cases=EPS_CASES,
            cases=("random", "large", "shifted"),
            reference_module="rmsnorm",
            torch_expr="out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight",
            torch_fn=t_rmsnorm,
        ),
        OpSpec(
            "layernorm",
            "LayerNorm over the last dim, with weight and bias",
            (_X, TensorDesc("weight", ("N",)), TensorDesc("bias", ("N",)), _OUT),
            ref_layernorm,
            norm_inputs(True),
            scalars={"eps": 1e-5},
            scalar_cases=EPS_CASES,
            cases=("random", "large", "shifted"),
            # fp32 x - mean at |mean| = 100 rounds at 1e-5 whatever the kernel does
            tolerance={**DEFAULT_TOL, "float32": Tolerance(1e-4, 1e-4)},
            reference_module="layernorm",
            torch_expr="out = F.layer_norm(x, (N,), weight, bias, eps)",
            torch_fn=t_layernorm,
        ),
        OpSpec(
            "cross_entropy",
            "per-row cross-entropy loss (fp32) from logits and int64 targets",
            (_X, TensorDesc("target", ("M",), "int64"), TensorDesc("loss", ("M",), "float32", output=True)),
            ref_cross_entropy,
            ce_inputs,
            **_CE_CASES,
            # the loss is fp32 whatever the logits are: only the kernel's own arithmetic errs
            tolerance={d: Tolerance(1e-4, 1e-4) for d in DTYPES},
            reference_module="cross_entropy",
            torch_expr="loss = F.cross_entropy(x, target, ignore_index=ignore_index, reduction='none')",
            torch_fn=t_cross_entropy,
        ),
        OpSpec(
            "cross_entropy_fwd",
            "per-row cross-entropy loss and log-sum-exp (fp32), the forward a training step runs",
            (
                *_CE_ROWS,
                TensorDesc("lse", ("M",), "float32", output=True),
            ),
            ref_cross_entropy_fwd,
            ce_inputs,
            **_CE_CASES,
            tolerance={d: Tolerance(1e-4, 1e-4) for d in DTYPES},
            reference_module="cross_entropy_fwd",
            torch_expr=(
                "loss = F.cross_entropy(x, target, ignore_index=ignore_index, reduction='none'); "
                "lse = torch.logsumexp(x.float(), -1)"
            ),
            torch_fn=t_cross_entropy_fwd,
        ),
        _softmax_bwd_spec(log=False),
        _softmax_bwd_spec(log=True),
        OpSpec(
            "cross_entropy_bwd",
            "cross-entropy backward per row: dlogits from the logits, targets, the forward's lse and dloss",
            (
                _X,
                TensorDesc("target", ("M",), "int64"),
                TensorDesc("lse", ("M",), "float32"),
                TensorDesc("dloss", ("M",), "float32"),
                TensorDesc("dx", ("M", "N"), output=True),
            ),
            ref_cross_entropy_bwd,
            ce_bwd_inputs,
            **_CE_CASES,
            reference_module="cross_entropy_bwd",
            torch_expr=(
                "dx = ((torch.exp(x.float() - lse[:, None]) - F.one_hot(target, N)) * dloss[:, None]).to(x.dtype), "
                "0 in rows where target == ignore_index"
            ),
            torch_fn=t_cross_entropy_bwd,
        ),
        OpSpec(
            "rmsnorm_fwd",
            "RMSNorm over the last dim for training: the output and each row's rstd (fp32)",
            (_X, _W, _OUT, _STAT("rstd")),
            ref_rmsnorm_fwd,
            norm_inputs(False),
            scalars={"eps": 1e-6},
            scalar_cases=EPS_CASES,
            cases=("random", "large", "shifted"),
            reference_module="rmsnorm_fwd",
            torch_expr="rstd = torch.rsqrt(x.float().pow(2).mean(-1) + eps); out = x * rstd[:, None] * weight",
            torch_fn=t_rmsnorm_fwd,
        ),
        OpSpec(
            "layernorm_fwd",
            "LayerNorm over the last dim for training: the output and each row's mean and rstd (fp32)",
            (_X, _W, TensorDesc("bias", ("N",)), _OUT, _STAT("mean"), _STAT("rstd")),
            ref_layernorm_fwd,
            norm_inputs(True),
            scalars={"eps": 1e-5},
            scalar_cases=EPS_CASES,
            cases=("random", "large", "shifted"),
            tolerance={**DEFAULT_TOL, "float32": Tolerance(1e-4, 1e-4)},
            reference_module="layernorm_fwd",
            torch_expr=(
                "mean = x.float().mean(-1); rstd = torch.rsqrt(x.float().var(-1, unbiased=False) + eps); "
                "out = F.layer_norm(x, (N,), weight, bias, eps)"
            ),
            torch_fn=t_layernorm_fwd,
        ),
        OpSpec(
            "rmsnorm_bwd",
            "RMSNorm backward over the last dim: dx, and dw summed over rows, from the forward's rstd",
            (_DY, _X, _W, _STAT("rstd", output=False), _DX, TensorDesc("dw", ("N",), output=True)),
            ref_rmsnorm_bwd,
            norm_bwd_inputs(False),
            cases=("random", "large", "shifted"),
            reference_module="rmsnorm_bwd",
            torch_expr=(
                "xhat = x * rstd[:, None]; g = dy * weight; "
                "dx = (g - xhat * (g * xhat).mean(-1, keepdim=True)) * rstd[:, None]; dw = (dy * xhat).sum(0)"
            ),
            torch_fn=t_rmsnorm_bwd,
            independent_rows=False,
        ),
        OpSpec(
            "layernorm_bwd",
            "LayerNorm backward over the last dim: dx, and dw, db summed over rows, from the forward's mean and rstd",
            (
                _DY,
                _X,
                _W,
                _STAT("mean", output=False),
                _STAT("rstd", output=False),
                _DX,
                TensorDesc("dw", ("N",), output=True),
                TensorDesc("db", ("N",), output=True),
            ),
            ref_layernorm_bwd,
            norm_bwd_inputs(True),
            cases=("random", "large", "shifted"),
            tolerance={**DEFAULT_TOL, "float32": Tolerance(1e-4, 1e-4)},
            reference_module="layernorm_bwd",
            torch_expr=(
                "xhat = (x - mean[:, None]) * rstd[:, None]; g = dy * weight; dx = (g - xhat * (g * xhat).mean(-1, "
                "keepdim=True) - g.mean(-1, keepdim=True)) * rstd[:, None]; dw = (dy * xhat).sum(0); db = dy.sum(0)"
            ),
            torch_fn=t_layernorm_bwd,
            independent_rows=False,
        ),
        OpSpec(
            "cross_entropy_fused",
            "cross-entropy forward and backward in one pass: each row's loss (fp32) and dlogits for an upstream scale",
            (
                _X,
                TensorDesc("target", ("M",), "int64"),
                TensorDesc("scale", ("1",), "float32"),
                TensorDesc("loss", ("M",), "float32", output=True),
                _DX,
            ),
            ref_cross_entropy_fused,
            ce_fused_inputs,
            **_CE_CASES,
            reference_module="cross_entropy_fused",
            torch_expr=(
                "loss = F.cross_entropy(x, target, ignore_index=ignore_index, reduction='none'); "
                "dx = ((torch.softmax(x.float(), -1) - F.one_hot(target, N)) * scale[0]).to(x.dtype), "
                "0 in rows where target == ignore_index"
            ),
            torch_fn=t_cross_entropy_fused,
        ),
        OpSpec(
            "scale",
            "x times two values read on the device, a fused loss's backward on the gradient it kept",
            (
                _X,
                TensorDesc("a", ("1",), "float32"),
                TensorDesc("b", ("1",), "float32"),
                TensorDesc("out", ("M", "N"), output=True),
            ),
            ref_scale,
            scale_inputs,
            cases=("random", "large"),
            reference_module="scale",
            torch_expr="out = (x * (a * b)).to(x.dtype)",
            torch_fn=t_scale,
        ),
        OpSpec(
            "cross_entropy_fused_total",
            "the fused cross-entropy for an upstream 1 and its total: each row's loss (fp32) and dlogits, "
            "then the losses' sum, their mean over the kept rows and 1 / kept",
            (
                *_CE_ROWS,
                _DX,
                *_TOTALS,
            ),
            ref_cross_entropy_fused_total,
            ce_inputs,
            **_CE_CASES,
            reference_module="cross_entropy_fused_total",
            torch_expr=(
                "loss = F.cross_entropy(x, target, ignore_index=ignore_index, reduction='none'); "
                "dx = (torch.softmax(x.float(), -1) - F.one_hot(target, N)).to(x.dtype), 0 in rows where "
                "target == ignore_index; " + _TOTALS_EXPR
            ),
            torch_fn=t_cross_entropy_fused_total,
            independent_rows=False,
        ),
        OpSpec(
            "cross_entropy_total",
            "the per-row cross-entropy (fp32) and its total, the loss without its gradient: the losses' "
            "sum, their mean over the kept rows and 1 / kept",
            (
                *_CE_ROWS,
                *_TOTALS,
            ),
            ref_cross_entropy_total,
            ce_inputs,
            **_CE_CASES,
            tolerance={d: Tolerance(1e-4, 1e-4) for d in DTYPES},
            reference_module="cross_entropy_total",
            torch_expr="loss = F.cross_entropy(x, target, ignore_index=ignore_index, reduction='none'); "
            + _TOTALS_EXPR,
            torch_fn=t_cross_entropy_total,
            independent_rows=False,
        ),
    )
}


BUILTIN.update({s.name: s for s in (attention_spec(d, c) for d in (128, 64) for c in (False, True))})


def _one_dy(rows: OpSpec) -> OpSpec:
    """`rows`, a backward whose first tensor is dy, for an upstream gradient of one value everywhere
    (`.sum()`'s, expanded), read as that value: dy a (1,) tensor after the tensor that gives the
    rows (x, or y), the kernel `reference_kernels.<name>_scalar`. Its reference, torch baseline
    and inputs are the rows op's with dy expanded from that value."""
    name = f"{rows.name}_scalar"

    def reference(x: torch.Tensor, dy: torch.Tensor, *rest: torch.Tensor, **scalars: float) -> list[torch.Tensor]:
        return rows.reference(dy[0].expand(x.shape), x, *rest, **scalars)

    def torch_fn(x: torch.Tensor, dy: torch.Tensor, *rest: torch.Tensor, **scalars: float) -> object:
        # (what autograd hands torch's backward after `.sum()`: dy expanded, read in place)
        return rows.torch_fn(dy.expand(x.shape), x, *rest, **scalars)

    def make_inputs(m: int, n: int, dtype: str, gen: torch.Generator, case: str, device: str) -> list[torch.Tensor]:
        dy, x, *rest = rows.make_inputs(m, n, dtype, gen, case, device)
        return [x, dy.reshape(-1)[:1].clone(), *rest]

    return dataclasses.replace(
        rows,
        name=name,
        summary=f"{rows.summary}; for an upstream gradient of one value everywhere (a .sum()'s), read as that value",
        tensors=(rows.tensors[1], _ONE_DY, *rows.tensors[2:]),
        reference=reference,
        make_inputs=make_inputs,
        reference_module=name,
        torch_expr=f"dy = dy[0].expand(M, N); {rows.torch_expr}",
        torch_fn=torch_fn,
    )


for _rows in ("softmax_bwd", "log_softmax_bwd", "rmsnorm_bwd", "layernorm_bwd"):
    BUILTIN[f"{_rows}_scalar"] = _one_dy(BUILTIN[_rows])
