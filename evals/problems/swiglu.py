"""SwiGLU activation: out = silu(gate) * up, elementwise over (M, N)."""

import torch
import torch.nn.functional as F
from torch import nn

M, N = 8192, 8192


class Model(nn.Module):
    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return F.silu(gate) * up


def get_inputs():
    return [torch.randn(M, N, dtype=torch.bfloat16), torch.randn(M, N, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
