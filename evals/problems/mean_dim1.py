"""Mean over dim 1 of a 4-D tensor (B, C, H, W) -> (B, H, W): a reduction over a non-last dim."""

import torch
from torch import nn

B, C, H, W = 64, 64, 64, 128


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=1)


def get_inputs():
    return [torch.randn(B, C, H, W, dtype=torch.float32)]


def get_init_inputs():
    return []
