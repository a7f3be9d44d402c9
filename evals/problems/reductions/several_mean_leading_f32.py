"""Mean over the two leading dims (a per-column mean of a batch of sequences)."""

import torch
from torch import nn

batch_size, rows, cols = 256, 1024, 1024


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(0, 1))


def get_inputs():
    return [torch.randn(batch_size, rows, cols, dtype=torch.float32)]


def get_init_inputs():
    return []
