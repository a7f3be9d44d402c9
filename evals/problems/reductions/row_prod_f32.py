"""Product of each row of values near 1 (a product of growth factors)."""

import torch
from torch import nn

batch_size, dim = 16384, 16384


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.prod(1.0 + 0.001 * x, dim=-1)


def get_inputs():
    return [torch.randn(batch_size, dim, dtype=torch.float32)]


def get_init_inputs():
    return []
