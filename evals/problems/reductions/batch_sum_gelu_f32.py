"""Sum of gelu(x) over the batch dim."""

import torch
import torch.nn.functional as F
from torch import nn

batch_size, dim = 16384, 16384


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(F.gelu(x), dim=0)


def get_inputs():
    return [torch.randn(batch_size, dim, dtype=torch.float32)]


def get_init_inputs():
    return []
