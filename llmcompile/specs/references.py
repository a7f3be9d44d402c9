"""What the built-in ops compute: float64 references (`ref_*`, on inputs upcast to float64) and
torch's own programs in the caller's dtypes (`t_*`: the eager and torch.compile baselines, and
the error an honest kernel may share with torch)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

# --------------------------------------------------------------------------- references


def ref_copy(x):
    return [x]


def ref_softmax(x):
    return [torch.softmax(x, dim=-1)]


def ref_log_softmax(x):
    return [torch.log_softmax(x, dim=-1)]


def ref_rmsnorm(x, w, eps):
    return [x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w]


def ref_layernorm(x, w, b, eps):
    return [F.layer_norm(x, (x.shape[-1],), w, b, eps)]


def ref_cross_entropy(x, target, ignore_index):
    return [F.cross_entropy(x, target, ignore_index=ignore_index, reduction="none").float().double()]


def ref_softmax_bwd(dy, y):
    return [y * (dy - (dy * y).sum(-1, keepdim=True))]


def ref_log_softmax_bwd(dy, y):
    return [dy - torch.exp(y) * dy.sum(-1, keepdim=True)]


def ref_cross_entropy_fwd(x, target, ignore_index):
    return [*ref_cross_entropy(x, target, ignore_index), torch.logsumexp(x, -1)]


def ref_cross_entropy_bwd(x, target, lse, dloss, ignore_index):
    # lse as the forward stored it (fp32): the gradient of the loss the forward reported
    p = torch.exp(x - lse[:, None])
    kept = target != ignore_index
    onehot = F.one_hot(torch.where(kept, target, 0), x.shape[-1]).to(p.dtype)
    return [(p - onehot) * torch.where(kept, dloss, 0.0)[:, None]]


def t_softmax_bwd(dy, y):
    return torch.ops.aten._softmax_backward_data(dy, y, -1, y.dtype)


def t_log_softmax_bwd(dy, y):
    return torch.ops.aten._log_softmax_backward_data(dy, y, -1, y.dtype)


def t_cross_entropy_fwd(x, t, ignore_index):
    return [F.cross_entropy(x, t, ignore_index=ignore_index, reduction="none"), torch.logsumexp(x.float(), -1)]


def t_cross_entropy_bwd(x, t, lse, dloss, ignore_index):
    kept = t != ignore_index
    p = torch.exp(x.float() - lse[:, None])
    p[torch.arange(x.shape[0], device=x.device), torch.where(kept, t, 0)] -= 1.0
    return (p * torch.where(kept, dloss, 0.0)[:, None]).to(x.dtype)


def ref_rmsnorm_fwd(x, w, eps):
    rstd = torch.rsqrt(x.pow(2).mean(-1) + eps)
    return [x * rstd[:, None] * w, rstd]


def ref_layernorm_fwd(x, w, b, eps):
    mean = x.mean(-1)
    rstd = torch.rsqrt((x - mean[:, None]).pow(2).mean(-1) + eps)
    return [(x - mean[:, None]) * rstd[:, None] * w + b, mean, rstd]


def ref_rmsnorm_bwd(dy, x, w, rstd):
    xhat, g = x * rstd[:, None], dy * w
    return [(g - xhat * (g * xhat).mean(-1, keepdim=True)) * rstd[:, None], (dy * xhat).sum(0)]


def ref_layernorm_bwd(dy, x, w, mean, rstd):
    xhat, g = (x - mean[:, None]) * rstd[:, None], dy * w
    dx = (g - xhat * (g * xhat).mean(-1, keepdim=True) - g.mean(-1, keepdim=True)) * rstd[:, None]
    return [dx, (dy * xhat).sum(0), dy.sum(0)]


# torch's own fused kernels, as a training step calls them (statistics shaped (M, 1) there);
# where a torch build has none for the device, the same in torch expressions
def torch_fused(name: str, *args):  # noqa: ANN202
    op = getattr(torch.ops.aten, name, None)
    if op is not None and args[0].is_cuda:
        try:
            return op(*args)
        except (RuntimeError, NotImplementedError):
            pass
    return None


def t_rmsnorm_fwd(x, w, eps):
    out = torch_fused("_fused_rms_norm", x, [x.shape[-1]], w, eps)
    if out is not None:
        return out
    rstd = torch.rsqrt(x.float().pow(2).mean(-1) + eps)
    return [(x.float() * rstd[:, None] * w.float()).to(x.dtype), rstd]


def t_rmsnorm_bwd(dy, x, w, rstd):
    out = torch_fused("_fused_rms_norm_backward", dy, x, [x.shape[-1]], rstd[:, None], w, [True, True])
    if out is not None:
        return out
    return [t.to(x.dtype) for t in ref_rmsnorm_bwd(dy.float(), x.float(), w.float(), rstd)]


def t_layernorm_fwd(x, w, b, eps):
    return torch.ops.aten.native_layer_norm(x, [x.shape[-1]], w, b, eps)


def t_layernorm_bwd(dy, x, w, mean, rstd):
    n = [x.shape[-1]]
    return torch.ops.aten.native_layer_norm_backward(dy, x, n, mean[:, None], rstd[:, None], w, w, [True] * 3)


def ref_cross_entropy_fused(x, target, scale, ignore_index):
    lse = torch.logsumexp(x, -1)
    dx = ref_cross_entropy_bwd(x, target, lse, scale.expand(x.shape[0]), ignore_index)[0]
    return [*ref_cross_entropy(x, target, ignore_index), dx]


def t_cross_entropy_fused(x, t, scale, ignore_index):
    lse = torch.logsumexp(x.float(), -1)
    return [
        t_cross_entropy(x, t, ignore_index),
        t_cross_entropy_bwd(x, t, lse, scale.expand(x.shape[0]), ignore_index),
    ]


def ref_scale(x, a, b):
    return [x * (a[0] * b[0])]


def t_scale(x, a, b):
    return (x * (a * b)).to(x.dtype)


def _totals(loss, target, ignore_index):
    total, kept = loss.sum(), (target != ignore_index).sum().clamp(min=1).to(loss.dtype)
    return [total.reshape(1), (total / kept).reshape(1), (1 / kept).reshape(1)]


def ref_cross_entropy_fused_total(x, target, ignore_index):
    loss, dx = ref_cross_entropy_fused(x, target, x.new_ones(1), ignore_index)[:2]
    return [loss, dx, *_totals(loss, target, ignore_index)]


def t_cross_entropy_fused_total(x, t, ignore_index):
    loss, dx = t_cross_entropy_fused(x, t, torch.ones(1, device=x.device), ignore_index)
    return [loss, dx, *_totals(loss.float(), t, ignore_index)]


def ref_cross_entropy_total(x, target, ignore_index):
    loss = ref_cross_entropy(x, target, ignore_index)[0]
    return [loss, *_totals(loss, target, ignore_index)]


def t_cross_entropy_total(x, t, ignore_index):
    loss = t_cross_entropy(x, t, ignore_index)
    return [loss, *_totals(loss.float(), t, ignore_index)]


def t_rmsnorm(x, w, eps):
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def t_layernorm(x, w, b, eps):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def t_cross_entropy(x, t, ignore_index):
    return F.cross_entropy(x, t, ignore_index=ignore_index, reduction="none")
