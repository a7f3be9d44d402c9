"""What the GIL costs a training step's backward (issue 47): the host time of a small step with the
GPU held busy (torch.cuda._sleep, so that no call waits on it), batches interleaved, for torch's
log_softmax; torch's with a no-op C hook on its output (the hook takes the GIL in autograd's
worker thread); ours, whose backward launches its planned kernel without the GIL; and ours with
that turned off (the kernel function called through Python, under the GIL).

    python -m evals.scripts.step_gil [--n 256] [--dtype bfloat16] [--repeats 40]
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from collections.abc import Callable

import torch

from llmcompile import kernels
from llmcompile.runtime import autograd_native, native_call

STEPS = 20  # a batch: steps launched while the GPU sleeps


def held_us(step: Callable[[], object]) -> float:
    """Host microseconds per step of a batch launched behind a ~0.1 s GPU sleep."""
    torch.cuda._sleep(int(2e8))
    t0 = time.perf_counter()
    for _ in range(STEPS):
        step()
    host = (time.perf_counter() - t0) / STEPS
    torch.cuda.synchronize()
    return 1e6 * host


def steps(m: int, n: int, dtype: torch.dtype) -> dict[str, Callable[[], object]]:
    ext, api = autograd_native.module(), native_call.native_api()
    if ext is None or api is None:
        raise SystemExit(f"the C++ nodes or the C call are not built here: {autograd_native.reason()}")
    x = torch.randn(m, n, device="cuda", dtype=dtype, requires_grad=True)
    dy = torch.randn(m, n, device="cuda", dtype=dtype)
    sink = collections.deque(maxlen=0)  # (its append: a C function that takes one argument, returns None)

    def hooked(x: torch.Tensor) -> torch.Tensor:
        y = torch.log_softmax(x, -1)
        y.register_hook(sink.append)
        return y

    def step(f: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], object]:
        return lambda: torch.autograd.grad((f(x) * dy).sum(), x)

    ours = step(kernels.log_softmax)

    def through_python() -> object:
        ext.set_native(None)
        try:
            return ours()
        finally:
            ext.set_native(api)

    return {
        "torch": step(lambda x: torch.log_softmax(x, -1)),
        "torch + a no-op C hook": step(hooked),
        "ours": ours,
        "ours, backward through Python": through_python,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=256)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--rows", type=int, nargs="+", default=[8, 32768])
    p.add_argument("--repeats", type=int, default=40)
    args = p.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    print(f"{torch.cuda.get_device_name(0)}, log_softmax step, {args.dtype}, N = {args.n}, median of {args.repeats}")
    print("| M | step | host us / step | / torch |\n|---|---|---|---|")
    for m in args.rows:
        fns = steps(m, args.n, dtype)
        for fn in fns.values():
            fn()
        torch.cuda.synchronize()
        names, got = list(fns), {k: [] for k in fns}
        for r in range(args.repeats):  # (a rotated order: a slow spell of the host falls on all alike)
            for name in names[r % len(names) :] + names[: r % len(names)]:
                got[name].append(held_us(fns[name]))
        base = statistics.median(got["torch"])
        for name in names:
            us = statistics.median(got[name])
            print(f"| {m} | {name} | {us:.1f} | {us / base:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
