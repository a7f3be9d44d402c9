"""The reference kernels as torch functions: `llmcompile.kernels.softmax(x)`, `rmsnorm(x, w,
eps=1e-6)`, `cross_entropy(logits, target)`, ... (`runtime/compiled.py`), differentiable where an
input requires grad (`runtime/autograd.py`: the forward kernel saving what the backward reads);
`cross_entropy_loss(logits, target)` the mean (or sum) loss whose forward pass writes dlogits;
the attention's backward is torch's attention backward kernel (`runtime/attention_backward.py`).
Each is also a torch.library op (`torch.ops.llmcompile.<name>`) torch.compile can call.
"""

from llmcompile.runtime import autograd
from llmcompile.runtime.autograd import cross_entropy_loss
from llmcompile.runtime.compiled import (
    ATTENTIONS,
    BY_NAME,
    READ_PROBES,
    attention,
    attention_causal,
    attention_causal_d64,
    attention_d64,
    attention_flags,
    copy,
    copy_probe,
    cross_entropy,
    cross_entropy_bwd,
    cross_entropy_fused,
    cross_entropy_fused_total,
    cross_entropy_fwd,
    cross_entropy_total,
    layernorm,
    layernorm_bwd,
    layernorm_bwd_scalar,
    layernorm_fwd,
    log_softmax,
    log_softmax_bwd,
    log_softmax_bwd_scalar,
    reference_function,
    rmsnorm,
    rmsnorm_bwd,
    rmsnorm_bwd_scalar,
    rmsnorm_fwd,
    scale,
    softmax,
    softmax_bwd,
    softmax_bwd_scalar,
)

# differentiable where x requires grad: the forward kernel saving what the backward kernel reads
softmax.grad_fn = autograd.softmax
log_softmax.grad_fn = autograd.log_softmax
cross_entropy.grad_fn = autograd.cross_entropy
rmsnorm.grad_fn = autograd.rmsnorm
layernorm.grad_fn = autograd.layernorm
# the attention's backward is torch's attention backward kernel on our o and lse
for _fn in ATTENTIONS:
    _fn.grad_fn = autograd.attention(_fn, *attention_flags(_fn))
del _fn

__all__ = [
    "BY_NAME", "READ_PROBES", "attention", "attention_causal", "attention_causal_d64", "attention_d64", "copy",
    "copy_probe", "cross_entropy", "cross_entropy_loss", "cross_entropy_bwd", "cross_entropy_fused",
    "cross_entropy_fused_total", "cross_entropy_fwd", "cross_entropy_total", "layernorm",
    "layernorm_bwd", "layernorm_bwd_scalar", "layernorm_fwd", "log_softmax", "log_softmax_bwd", "log_softmax_bwd_scalar", "reference_function",
    "rmsnorm", "rmsnorm_bwd", "rmsnorm_bwd_scalar", "rmsnorm_fwd", "scale", "softmax", "softmax_bwd", "softmax_bwd_scalar",
]  # fmt: skip
