"""The inputs an op is verified and timed on: each built-in op's maker (random, and the value
distributions its cases name), and the generic cases every problem also gets."""

from __future__ import annotations

import torch

from llmcompile.specs.types import DTYPES

# --------------------------------------------------------------------------- input makers


def logits(m: int, n: int, dtype: str, gen: torch.Generator, case: str, device: str) -> torch.Tensor:
    x = torch.randn(m, n, generator=gen, dtype=torch.float32, device=gen.device)
    if case == "large":
        x = x * 1000.0
    elif case == "neg_inf":
        # -inf scattered over ~10% of entries, and one whole row when there are several
        x = torch.where(torch.rand(m, n, generator=gen, device=gen.device) < 0.1, torch.tensor(float("-inf")), x)
        if m > 2:
            x[m // 2] = float("-inf")
    elif case == "shifted":
        x = x + 30.0  # exp overflows without the max subtraction
    return x.to(DTYPES[dtype]).to(device)


def softmax_inputs(m, n, dtype, gen, case, device):
    return [logits(m, n, dtype, gen, case, device)]


def scale_inputs(m, n, dtype, gen, case, device):
    """x, and two fp32 values (an upstream gradient, a mean's 1/kept)."""
    a, b = (torch.randn(1, generator=gen, device=gen.device) for _ in range(2))
    return [logits(m, n, dtype, gen, case, device), a.to(device), (b.abs() / 1000).to(device)]


def norm_inputs(with_bias: bool):
    def make(m, n, dtype, gen, case, device):
        x = torch.randn(m, n, generator=gen, device=gen.device)
        if case == "large":
            x = x * 1000.0
        elif case == "shifted":
            x = x + 100.0  # a large mean: exposes E[x^2] - E[x]^2 cancellation
        w = torch.rand(n, generator=gen, device=gen.device) + 0.5
        out = [x.to(DTYPES[dtype]).to(device), w.to(DTYPES[dtype]).to(device)]
        if with_bias:
            out.append(torch.randn(n, generator=gen, device=gen.device).to(DTYPES[dtype]).to(device))
        return out

    return make


IGNORE_CASE = 7  # the ignore_index of the cross-entropy ops' "ignore_7" case (scalar_cases)


def ce_inputs(m, n, dtype, gen, case, device):
    x = logits(m, n, dtype, gen, "large" if case == "large" else "random", device)
    target = torch.randint(0, n, (m,), generator=gen, dtype=torch.int64, device=gen.device)
    if case in ("ignore_index", "ignore_7"):
        ignored = -100 if case == "ignore_index" else IGNORE_CASE
        target = torch.where(torch.rand(m, generator=gen, device=gen.device) < 0.3, torch.tensor(ignored), target)
    return [x, target.to(device)]


# --------------------------------------------------------------------------- generic cases
# Inputs every problem is also verified on, made from its random ones. A bound fair to every
# honest order of a long reduction cannot see one skipped term among many small ones (verify.py);
# on these the same slip moves the answer far past it.
#   spikes:     1.5 x SPIKE added along every edge and across the middle of the first floating
#               input (its first and middle index in each dim: a tile or a split in halves that
#               drops a row), 2 x SPIKE along its last index (an off-by-one), and SPIKE of either
#               sign at one random element in SPIKE_EVERY: a term skipped at any of these costs
#               one 64x the rest, and one skipped at the end of a max is the max
#   dips:       the same, subtracted: the last index holds each min
#   integers:   every floating input small integers, a zero-sum cycle along every dim, so sums in
#               any order are exact in fp32 and a skipped term moves the result by at least 1
#   degenerate: rows of zeros and a constant row in the first floating input (a user's padding)
GENERIC_CASES = ("spikes", "dips", "integers", "degenerate")
SPIKE = 64.0
SPIKE_EVERY = 1024
CYCLE = (1.0, -1.0, 2.0, -2.0, 3.0, -3.0, 4.0, -4.0)


def generic_inputs(case: str, inputs: list[torch.Tensor], gen: torch.Generator) -> list[torch.Tensor] | None:
    """`inputs` (random ones) turned into a generic case's; None when the case says nothing here
    (no floating input; fewer than three rows for `degenerate`)."""
    first = next((i for i, x in enumerate(inputs) if x.is_floating_point()), None)
    if first is None:
        return None
    out = list(inputs)
    x = inputs[first]
    if case in ("spikes", "dips"):
        y = x.float().clone()
        sign = 1.0 if case == "spikes" else -1.0
        for d in range(y.dim()):
            for i in sorted({0, y.shape[d] // 2, y.shape[d] - 1}):
                y.select(d, i).add_(sign * SPIKE * (2.0 if i == y.shape[d] - 1 else 1.5))
        where = torch.rand(y.shape, generator=gen, device=gen.device).to(y.device) < 1.0 / SPIKE_EVERY
        signs = torch.where(torch.rand(y.shape, generator=gen, device=gen.device).to(y.device) < 0.5, -SPIKE, SPIKE)
        out[first] = torch.where(where, y + signs, y).to(x.dtype)
    elif case == "integers":
        for i, t in enumerate(inputs):
            if not t.is_floating_point():
                continue
            order = torch.randperm(len(CYCLE), generator=gen, device=gen.device).to(t.device)
            cycle = torch.tensor(CYCLE, device=t.device)[order]
            index = torch.zeros((), dtype=torch.int64, device=t.device)
            for size in t.shape:
                index = index.unsqueeze(-1) + torch.arange(size, device=t.device)  # the sum of each element's indices
            out[i] = cycle[index % len(CYCLE)].to(t.dtype).reshape(t.shape)
    elif case == "degenerate":
        if x.dim() < 1 or x.shape[0] < 3:
            return None
        y = x.clone()
        m = x.shape[0]
        y[0] = 0.0
        y[m // 3] = 0.0
        y[m // 2] = 3.0
        out[first] = y
    else:
        raise ValueError(f"unknown generic case {case!r}")
    return out


# --------------------------------------------------------------------------- backward ops
# Their inputs come from the forward (its output y, its lse), made here from the forward's own
# torch op on the same logits, so the gradient is that of a real forward pass. The random draws
# come from the CPU generator (the same inputs on any device); what follows from them is computed
# on the target device (at the benchmark's 2^28 elements, a CPU softmax costs seconds a set).


def softmax_bwd_inputs(log: bool):
    def make(m, n, dtype, gen, case, device):
        x = logits(m, n, "float32", gen, "large" if case == "peaked" else "random", device)
        y = torch.log_softmax(x, -1) if log else torch.softmax(x, -1)
        del x
        dy = torch.randn(m, n, generator=gen, device=gen.device)
        if case == "large":
            dy = dy * 1000.0
        return [dy.to(DTYPES[dtype]).to(device), y.to(DTYPES[dtype])]

    return make


def ce_bwd_inputs(m, n, dtype, gen, case, device):
    x, target = ce_inputs(m, n, dtype, gen, case, device)
    dloss = torch.randn(m, generator=gen, device=gen.device)
    return [x, target, torch.logsumexp(x.float(), -1), dloss.to(device)]


def norm_bwd_inputs(with_bias: bool):
    forward = norm_inputs(with_bias)

    def make(m, n, dtype, gen, case, device):
        x, w, *_ = forward(m, n, dtype, gen, case, device)
        dy = torch.randn(m, n, generator=gen, device=gen.device).to(DTYPES[dtype]).to(device)
        xf = x.float()  # the statistics as the forward kernels save them: fp32
        if with_bias:
            mean = xf.mean(-1)
            stats = [mean, torch.rsqrt((xf - mean[:, None]).pow(2).mean(-1) + 1e-5)]
        else:
            stats = [torch.rsqrt(xf.pow(2).mean(-1) + 1e-6)]
        del xf
        return [dy, x, w, *stats]

    return make


def ce_fused_inputs(m, n, dtype, gen, case, device):
    x, target = ce_inputs(m, n, dtype, gen, case, device)
    kept = (target != -100).sum().clamp(min=1)
    return [x, target, (1.0 / kept.double()).float().reshape(1)]  # a mean's upstream gradient
