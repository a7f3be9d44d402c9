"""Mean of relu(x) over the middle dim: a prologue."""

import torch
from torch import nn

batch_size, rows, cols = 128, 4096, 1024


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mean(torch.relu(x), dim=1)


def get_inputs():
    return [torch.randn(batch_size, rows, cols, dtype=torch.float16)]


def get_init_inputs():
    return []
