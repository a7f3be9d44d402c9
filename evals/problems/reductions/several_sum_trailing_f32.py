"""Sum over the two trailing dims (a per-sample total)."""

import torch
from torch import nn

batch_size, rows, cols = 256, 1024, 1024


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(dim=(1, 2))


def get_inputs():
    return [torch.randn(batch_size, rows, cols, dtype=torch.float32)]


def get_init_inputs():
    return []
