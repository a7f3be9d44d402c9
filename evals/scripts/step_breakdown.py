"""Where the host time of a small training step goes (GPU): a step through autograd and its pieces
(the forward with grad, the backward alone on a kept graph, the backward kernel called directly),
ours beside torch eager on the same tensors, bf16 2 x M/2 x N (M = 8 unless given), the batches interleaved.

    python -m evals.scripts.step_breakdown [--n 1024] [--m 8]        # the C++ autograd nodes
    LLMCOMPILE_NATIVE_AUTOGRAD=0 python -m evals.scripts.step_breakdown   # the Python Functions

At this size every kernel takes a few microseconds: what is measured is the host's time.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

from evals.scripts.host_overhead import interleaved_us
from llmcompile import kernels


def pieces(n: int, m: int = 8) -> dict[str, tuple[Callable[[], object], Callable[[], object]]]:
    """Each piece: (ours, torch's), on x of (2, m // 2, n)."""
    x = torch.randn(2, m // 2, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.rand(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(2, m // 2, n, device="cuda", dtype=torch.bfloat16)
    ys = (kernels.softmax(x), torch.softmax(x, -1))
    sums = tuple(y.sum() for y in ys)
    rs = (kernels.rmsnorm(x, w, eps=1e-5).sum(), F.rms_norm(x, (n,), w, 1e-5).sum())
    y, one = ys[0].detach(), torch.ones(1, device="cuda", dtype=torch.bfloat16)
    return {
        "softmax step: grad(softmax(x).sum())": (
            lambda: torch.autograd.grad(kernels.softmax(x).sum(), x),
            lambda: torch.autograd.grad(torch.softmax(x, -1).sum(), x),
        ),
        "softmax forward with grad": (lambda: kernels.softmax(x), lambda: torch.softmax(x, -1)),
        "softmax backward of .sum(), graph kept": (
            lambda: torch.autograd.grad(sums[0], x, retain_graph=True),
            lambda: torch.autograd.grad(sums[1], x, retain_graph=True),
        ),
        "softmax backward of a dense dy, graph kept": (
            lambda: torch.autograd.grad(ys[0], x, dy, retain_graph=True),
            lambda: torch.autograd.grad(ys[1], x, dy, retain_graph=True),
        ),
        "softmax backward kernel alone, one dy value": (
            lambda: kernels.softmax_bwd_scalar(y, one),
            lambda: torch.ops.aten._softmax_backward_data(one[0].expand_as(y), y, -1, y.dtype),
        ),
        "rmsnorm step: grad(rmsnorm(x, w, eps=1e-5).sum())": (
            lambda: torch.autograd.grad(kernels.rmsnorm(x, w, eps=1e-5).sum(), (x, w)),
            lambda: torch.autograd.grad(F.rms_norm(x, (n,), w, 1e-5).sum(), (x, w)),
        ),
        "rmsnorm forward with grad, eps=1e-5": (
            lambda: kernels.rmsnorm(x, w, eps=1e-5),
            lambda: F.rms_norm(x, (n,), w, 1e-5),
        ),
        "rmsnorm backward of .sum(), graph kept": (
            lambda: torch.autograd.grad(rs[0], (x, w), retain_graph=True),
            lambda: torch.autograd.grad(rs[1], (x, w), retain_graph=True),
        ),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=1024)
    p.add_argument("--m", type=int, default=8, help="rows (even): QuACK's small grid has 32768")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args(argv)
    nodes = os.environ.get("LLMCOMPILE_NATIVE_AUTOGRAD", "1") != "0"
    shape = f"2 x {args.m // 2} x {args.n}"
    print(f"{torch.cuda.get_device_name(0)}, bf16 {shape}, autograd: {'C++ nodes' if nodes else 'Python'}")
    print("| piece | ours (us) | torch eager (us) | ours / torch |\n|---|---|---|---|")
    for name, (ours, theirs) in pieces(args.n, args.m).items():
        t = interleaved_us({"ours": ours, "torch": theirs}, args.calls, args.repeats)
        print(f"| {name} | {t['ours']:.2f} | {t['torch']:.2f} | {t['ours'] / t['torch']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
