"""Infinity norm (largest |x|) of each row."""

import torch
from torch import nn

batch_size, dim = 16384, 16384


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.vector_norm(x, ord=float("inf"), dim=-1)


def get_inputs():
    return [torch.randn(batch_size, dim, dtype=torch.float32)]


def get_init_inputs():
    return []
