"""Causal softmax attention forward: query i attends to keys 0..i (the attention kernel with
the mask; key tiles wholly past a query tile are never loaded).

Kernel contract entry: as `attention`.
"""

from __future__ import annotations

from reference_kernels.attention import Attention

OP = "attention_causal"

launch = Attention(causal=True)
