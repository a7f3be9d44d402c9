"""Where the host time of a small training step goes (GPU): a step through autograd and its pieces
(the forward with grad, the backward alone on a kept graph, the backward kernel called directly),
ours beside torch eager on the same tensors, bf16 2 x M/2 x N (M = 8 unless given), the batches interleaved.

    python -m evals.scripts.step_breakdown [--n 1024] [--m 8]        # the C++ autograd nodes
    python -m evals.scripts.step_breakdown --phases --op log_softmax --dtype float32 --m 32768 --n 256
    python -m evals.scripts.step_breakdown --cold --op log_softmax --dtype float32 --m 32768 --n 256
    LLMCOMPILE_NATIVE_AUTOGRAD=0 python -m evals.scripts.step_breakdown   # the Python Functions

At this size every kernel takes a few microseconds: what is measured is the host's time.
`--phases` times the bench's step (`llmcompile bench --train`) one step at a time instead, each of
its phases (forward, `* dy`, `.sum()`, the gradients) by the host's clock, with the GPU idle at the
step's start or held busy; ours and torch's alternate step by step, and each phase's difference is
taken within a pair: a gap of a few us a step, which batches of whole steps lose in the host's
spread, shows here; so does each thread's CPU time in the step (the main thread's, and the rest's:
autograd's worker runs the backward), which tells work from waiting.
`--cold` times the step's pieces alone, ours and torch's paired, with the host's caches warm (the
call repeated) and cold (a 64 MB CPU sweep before each call, as the rest of a step does to them).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from evals.scripts.call_forms import interleaved_us
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


PHASES = ("forward", "* dy", ".sum()", "gradients", "step")
CPU_ROWS = ("CPU, main thread", "CPU, other threads")


def _thread_clock(tid: int) -> int:
    """Linux's CPU-time clock of thread `tid` of this process (MAKE_THREAD_CPUCLOCK(tid, SCHED))."""
    return (~tid << 3) | 6


def thread_cpu(tids: list[int]) -> tuple[float, float]:
    """CPU seconds so far of the first of `tids` (the main thread) and of the rest together."""
    ns = []
    for tid in tids:
        try:
            ns.append(time.clock_gettime_ns(_thread_clock(tid)))
        except OSError:  # (a thread that has ended)
            ns.append(0)
    return ns[0] * 1e-9, sum(ns[1:]) * 1e-9


def phase_times(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, dy: torch.Tensor) -> tuple[float, ...]:
    """One step's host seconds in each of PHASES."""
    t0 = time.perf_counter()
    out = fn(x)
    t1 = time.perf_counter()
    prod = out * dy
    t2 = time.perf_counter()
    total = prod.sum()
    t3 = time.perf_counter()
    torch.autograd.grad(total, [x])
    t4 = time.perf_counter()
    return (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0)


def paired(ours: list[tuple[float, ...]], theirs: list[tuple[float, ...]]) -> list[tuple[float, float, float, int]]:
    """Each phase: ours' median us, torch's, the median of ours minus torch's within a pair, and in
    how many pairs ours was lower."""
    rows = []
    for j in range(len(ours[0])):
        a, b = [1e6 * s[j] for s in ours], [1e6 * s[j] for s in theirs]
        d = [u - v for u, v in zip(a, b)]
        rows.append((statistics.median(a), statistics.median(b), statistics.median(d), sum(v < 0 for v in d)))
    return rows


def phases(op: str, dtype: str, m: int, n: int, samples: int) -> dict[str, list[tuple[float, float, float, int]]]:
    """The bench's step of `op` (softmax or log_softmax) on m x n, by phase: 'idle' (synchronized,
    then 100 us of spin, so the GPU has drained) and 'busy' (a sleep kernel queued first, so only the
    host is timed)."""
    from llmcompile.bench import train

    x = torch.randn(m, n, device="cuda", dtype=getattr(torch, dtype)).requires_grad_()
    dy = torch.randn_like(x)
    fns = {k: train.IMPLS[k](op, n, {}) for k in ("llmcompile", "eager")}
    for fn in fns.values():
        for _ in range(20):
            phase_times(fn, x, dy)
    # (after the steps above: autograd's worker thread for the GPU exists)
    main_tid = threading.get_native_id()
    tids = [main_tid] + [t for t in map(int, os.listdir("/proc/self/task")) if t != main_tid]
    got: dict[tuple[str, str], list[tuple[float, ...]]] = {}
    for i in range(samples):
        for mode in ("idle", "busy"):
            for name in list(fns)[:: 1 if i % 2 == 0 else -1]:
                torch.cuda.synchronize()
                if mode == "busy":
                    # (about 1.5 ms: longer than the slowest step's host time seen, 0.8 ms)
                    torch.cuda._sleep(3_000_000)
                else:
                    until = time.perf_counter() + 1e-4
                    while time.perf_counter() < until:
                        pass
                cpu0 = thread_cpu(tids)
                times = phase_times(fns[name], x, dy)
                cpu1 = thread_cpu(tids)
                got.setdefault((mode, name), []).append(times + tuple(b - a for a, b in zip(cpu0, cpu1)))
    torch.cuda.synchronize()
    return {mode: paired(got[(mode, "llmcompile")], got[(mode, "eager")]) for mode in ("idle", "busy")}


def cold_pieces(op: str, dtype: str, m: int, n: int) -> dict[str, tuple[Callable[[], object], Callable[[], object]]]:
    """The step's pieces alone on m x n, each (ours, torch's), and a torch multiply in both places
    (the control: its two sides must tie)."""
    dt = getattr(torch, dtype)
    x = torch.randn(m, n, device="cuda", dtype=dt)
    xg, dy = x.clone().requires_grad_(), torch.randn_like(x)
    ours, bwd = getattr(kernels, op), getattr(kernels, f"{op}_bwd")
    theirs = torch.softmax if op == "softmax" else torch.log_softmax
    aten_bwd = torch.ops.aten._softmax_backward_data if op == "softmax" else torch.ops.aten._log_softmax_backward_data
    y = theirs(x, -1)
    return {
        f"{op} forward with grad": (lambda: ours(xg), lambda: theirs(xg, -1)),
        f"{op} forward without grad": (lambda: ours(x), lambda: theirs(x, -1)),
        f"{op} backward kernel, dense dy": (lambda: bwd(dy, y), lambda: aten_bwd(dy, y, -1, dt)),
        "copy / clone": (lambda: kernels.copy(x), lambda: x.clone()),
        "x * dy (torch's on both sides)": (lambda: x * dy, lambda: x * dy),
    }


def cold(op: str, dtype: str, m: int, n: int, samples: int) -> list[tuple[str, str, tuple[float, float, float, int]]]:
    """Each of `cold_pieces`' host us, ours and torch's alternating, synchronized before each call:
    warm caches, then after a 64 MB CPU sweep (rows: piece, caches, `paired`'s tuple)."""
    sweep = torch.zeros(16 << 20, dtype=torch.float32)

    def one(fn: Callable[[], object], cold: bool) -> tuple[float]:
        torch.cuda.synchronize()
        if cold:
            sweep.add_(1.0)
        t0 = time.perf_counter()
        out = fn()
        t = time.perf_counter() - t0
        del out  # (after the clock: a node's teardown is not the call's)
        return (t,)

    rows = []
    for name, (ours, theirs) in cold_pieces(op, dtype, m, n).items():
        for _ in range(50):
            ours(), theirs()
        for caches in ("warm", "cold"):
            a, b = [], []
            for i in range(samples):
                first, second = (ours, theirs) if i % 2 == 0 else (theirs, ours)
                r1, r2 = one(first, caches == "cold"), one(second, caches == "cold")
                a.append(r1 if i % 2 == 0 else r2)
                b.append(r2 if i % 2 == 0 else r1)
            rows.append((name, caches, paired(a, b)[0]))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=1024)
    p.add_argument("--m", type=int, default=8, help="rows (even): QuACK's small grid has 32768")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--phases", action="store_true", help="the bench's step, phase by phase, step by step")
    p.add_argument("--cold", action="store_true", help="the step's pieces alone, host caches warm and cold")
    p.add_argument("--op", default="log_softmax", choices=("softmax", "log_softmax"))
    p.add_argument("--dtype", default="float32")
    p.add_argument("--samples", type=int, default=1500, help="--phases: steps of each, each GPU state (--cold: calls)")
    args = p.parse_args(argv)
    nodes = os.environ.get("LLMCOMPILE_NATIVE_AUTOGRAD", "1") != "0"
    if args.cold:
        head = f"{args.op} {args.dtype} {args.m} x {args.n}, {args.samples} calls each"
        print(f"{torch.cuda.get_device_name(0)}, {head}, autograd: {'C++ nodes' if nodes else 'Python'}")
        print("| piece | host caches | ours (us) | torch eager (us) | ours - torch, paired | ours lower |")
        print("|---|---|---|---|---|---|")
        for name, caches, (a, b, d, lower) in cold(args.op, args.dtype, args.m, args.n, args.samples):
            print(f"| {name} | {caches} | {a:.2f} | {b:.2f} | {d:+.2f} | {lower}/{args.samples} |")
        return 0
    if args.phases:
        head = f"{args.op} {args.dtype} {args.m} x {args.n}, {args.samples} steps each"
        print(f"{torch.cuda.get_device_name(0)}, {head}, autograd: {'C++ nodes' if nodes else 'Python'}")
        print(
            "| GPU | phase | ours (us) | torch eager (us) | ours - torch, paired | ours lower |\n|---|---|---|---|---|---|"
        )
        for mode, rows in phases(args.op, args.dtype, args.m, args.n, args.samples).items():
            for name, (a, b, d, lower) in zip(PHASES + CPU_ROWS, rows):
                print(f"| {mode} | {name} | {a:.1f} | {b:.1f} | {d:+.2f} | {lower}/{args.samples} |")
        return 0
    shape = f"2 x {args.m // 2} x {args.n}"
    print(f"{torch.cuda.get_device_name(0)}, bf16 {shape}, autograd: {'C++ nodes' if nodes else 'Python'}")
    print("| piece | ours (us) | torch eager (us) | ours / torch |\n|---|---|---|---|")
    for name, (ours, theirs) in pieces(args.n, args.m).items():
        t = interleaved_us({"ours": ours, "torch": theirs}, args.calls, args.repeats)
        print(f"| {name} | {t['ours']:.2f} | {t['torch']:.2f} | {t['ours'] / t['torch']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
