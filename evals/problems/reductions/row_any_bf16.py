"""Whether each row holds a value above 4."""

import torch
from torch import nn

batch_size, dim = 32768, 16384


class Model(nn.Module):
    def forward(self, x: torch.Tensor):
        return (x > 4.0).any(dim=-1)


def get_inputs():
    return [torch.randn(batch_size, dim, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
