"""Where the host time of one eager call goes (GPU): each piece of the lean call path timed alone.

python -m evals.call_breakdown
"""

from __future__ import annotations

import sys

import torch

from evals.host_overhead import per_call_us
from llmcompile import kernels


def main() -> int:
    x = torch.randn(8, 1024, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(x)
    fn = kernels.softmax
    fn(x)
    raw = fn.compiled("bfloat16", 1024)
    plan = fn._plans[(torch.bfloat16, 1024)]
    pieces = {
        "torch.softmax (eager)": lambda: torch.softmax(x, -1),
        "kernels.softmax(x)": lambda: fn(x),
        "compiled fn(x, out), outputs preallocated": lambda: raw(x, out),
        "plan.fn(x, out)": lambda: plan.fn(x, out),
        "torch.empty((8, 1024))": lambda: torch.empty((8, 1024), dtype=torch.bfloat16, device=x.device),
        "torch.empty_like(x)": lambda: torch.empty_like(x),
        "x.view(8, 1024)": lambda: x.view(8, 1024),
        "torch.compiler.is_compiling()": torch.compiler.is_compiling,
        "x.is_contiguous() + data_ptr() + is_cuda": lambda: (x.is_contiguous(), x.data_ptr(), x.is_cuda),
        "x.device": lambda: x.device,
        "x.numel() + x.shape[-1] + x.dim()": lambda: (x.numel(), x.shape[-1], x.dim()),
    }
    for name, f in pieces.items():
        print(f"{per_call_us(f, 2000, 5):8.2f} us  {name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
