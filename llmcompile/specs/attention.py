"""The attention ops: q, k, v, o of (batch x heads, sequence, head dim), each query's log-sum-exp;
compute-bound, rated in TFLOP/s against the dense GEMM measured beside them."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from llmcompile.specs.types import DTYPES, OpSpec, TensorDesc, Tolerance

# --------------------------------------------------------------------------- attention
# Rows are (batch x head) pairs: q, k, v and o are (M, N, D) with N the sequence length and D
# the head dim (fixed per spec), lse (M, N) fp32. Heads are independent, so M chunks like rows.
ATTN_TOKENS = 1 << 18  # M * N across the grid: 16 heads x 16K tokens at the longest
ATTN_SEQLENS = (1024, 2048, 4096, 8192, 16384)
ATTN_HELD_OUT = ((3, 1000), (2, 5001), (5, 129))  # partial last tiles of queries and keys
ATTN_REF_ELEMS = 1 << 26  # float64 scores a reference step holds (512 MiB)


def attention_flops(d: int, causal: bool) -> Callable[[int, int], float]:
    """Two GEMMs (QK^T, PV) of 2*N*N*D each a head; causal does half (the convention the FA
    papers and cuDNN report in, so TFLOP/s compare)."""

    def flops(m: int, n: int) -> float:
        return 4.0 * m * n * n * d / (2 if causal else 1)

    return flops


def ref_attention(causal: bool):
    def ref(q, k, v, scale):
        m, n, _ = q.shape
        o = torch.empty_like(q)
        lse = torch.empty(m, n, dtype=q.dtype, device=q.device)
        step = max(1, ATTN_REF_ELEMS // max(1, m * n))
        cols = torch.arange(n, device=q.device)
        for i in range(0, n, step):
            s = torch.einsum("bqd,bkd->bqk", q[:, i : i + step], k) * scale
            if causal:
                rows = torch.arange(i, min(n, i + step), device=q.device)
                s.masked_fill_(cols[None, None, :] > rows[None, :, None], float("-inf"))
            lse_i = torch.logsumexp(s, -1)
            o[:, i : i + step] = torch.einsum("bqk,bkd->bqd", torch.exp(s - lse_i[..., None]), v)
            lse[:, i : i + step] = lse_i
            del s
        return [o, lse]

    return ref


def attention_inputs(d: int):
    def make(m, n, dtype, gen, case, device):
        q, k, v = (torch.randn(m, n, d, generator=gen, device=gen.device) for _ in range(3))
        if case == "large":
            q = q * 16.0  # logits ~ N(0, 16^2): each row's softmax all but one-hot
        return [t.to(DTYPES[dtype]).to(device) for t in (q, k, v)]

    return make


def t_attention(causal: bool):
    def fn(q, k, v, scale):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)

    return fn


def attention_spec(d: int, causal: bool) -> OpSpec:
    name = "attention" + ("_causal" if causal else "") + ("" if d == 128 else f"_d{d}")
    head = ("M", "N", str(d))
    return OpSpec(
        name,
        f"{'causal ' if causal else ''}softmax attention forward, head dim {d}: o and each query's log-sum-exp",
        (
            TensorDesc("q", head),
            TensorDesc("k", head),
            TensorDesc("v", head),
            TensorDesc("o", head, output=True),
            TensorDesc("lse", ("M", "N"), "float32", output=True),
        ),
        ref_attention(causal),
        attention_inputs(d),
        scalars={"scale": 1.0 / d**0.5},
        cases=("random", "large"),
        # P is rounded to the input dtype before the second GEMM (as every flash kernel does)
        tolerance={"bfloat16": Tolerance(2e-2, 2e-2), "float16": Tolerance(4e-3, 4e-3)},
        dtypes=("bfloat16", "float16"),
        reference_module="attention" + ("_causal" if causal else ""),
        torch_expr=(
            f"o = F.scaled_dot_product_attention(q, k, v, is_causal={causal}, scale=scale); "
            f"lse = torch.logsumexp((q.float() @ k.float().transpose(1, 2)) * scale{' (causal mask)' if causal else ''}, -1)"
        ),
        torch_fn=t_attention(causal),
        fixed_shapes=tuple((ATTN_TOKENS // n, n) for n in ATTN_SEQLENS),
        flops=attention_flops(d, causal),
        extra_verify=ATTN_HELD_OUT,
        reference_scratch=3 * 8 * ATTN_REF_ELEMS,  # the scores, their exp, the mask
    )
