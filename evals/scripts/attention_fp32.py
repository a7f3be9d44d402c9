"""KernelBench's 97_ScaledDotProductAttention (fp32, B x H = 32 x 32, N = 512, D = 1024) at its own
size: the kernel the offline default writes for it (reference_kernels/attention_tf32.py) beside
torch's scaled_dot_product_attention, its default choice and each backend that takes fp32.

The problem sits between two limits, both measured here in the same process: 8 GiB must move
(Q, K, V read, O written: 2.9 ms at 3 TB/s) and 1.1 TFLOP must be done (4 B H N^2 D), which the
kernel does on TF32 tensor cores: the TF32 GEMM probe (torch.matmul with TF32 allowed) is its
compute ceiling. Times are medians of CUDA events, under a CUDA graph and from eager calls.

    python -m evals.scripts.attention_fp32 PROBLEM_FILE [--batch B]
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from llmcompile import kernels
from llmcompile.agent import patterns
from llmcompile.bench import timing
from llmcompile.specs import contract, get_op
from reference_kernels.attention_tf32 import AttentionTf32

BACKENDS = {"sdpa math": SDPBackend.MATH, "sdpa efficient": SDPBackend.EFFICIENT_ATTENTION}


def signature(d: int) -> contract.Signature:
    """AttentionTf32's entry at head dim `d`: q, k, v, o (M, N, D) fp32, then the scale."""
    return contract.Signature((contract.TensorSig(("M", "N", str(d)), "float32"),) * 4, {"scale": 0.125})


def tf32_gemm_tflops() -> float:
    """torch.matmul of fp32 8192^3 with TF32 allowed: cuBLAS on the TF32 tensor cores."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        return timing.gemm_tflops(torch.float32)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("problem", help="the problem file (97_ScaledDotProductAttention.py)")
    ap.add_argument("--batch", type=int, default=0, help="batch size (default: the problem's own)")
    ap.add_argument("--warps-m", default="2,4", help="other AttentionTf32 warp layouts to time (comma-separated)")
    args = ap.parse_args(argv)

    spec = get_op(args.problem)
    m = patterns.match(spec)
    if not isinstance(m, patterns.Match) or m.pattern != "attention_tf32":
        raise SystemExit(f"{args.problem}: not an attention problem the offline default takes ({m})")
    (b0, n) = spec.fixed_shapes[0]
    b = args.batch or b0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.py"
        path.write_text(m.source)
        fn = contract.compile_entry(contract.entry_of(contract.load_module(path)), spec, "float32", n)
    q, k, v = spec.make_inputs(b, n, "float32", torch.Generator().manual_seed(97), "random", "cuda")
    out = torch.empty_like(q)
    _, h, s, d = q.shape
    flops = 4 * b * h * s * s * d
    moved = 4 * q.nbytes

    impls: dict[str, Callable[[], object]] = {"ours (TF32)": lambda: fn(q, k, v, out)}
    rows = (b * h, s, d)
    for w in filter(None, args.warps_m.split(",")):
        f = contract.compile_entry(AttentionTf32(int(w)), signature(d), "float32", s)
        impls[f"ours, warps_m={w}"] = lambda f=f: f(q.view(rows), k.view(rows), v.view(rows), out.view(rows), d**-0.5)
    ref = F.scaled_dot_product_attention(q, k, v)
    for name, call in impls.items():
        out.fill_(float("nan"))
        call()
        print(f"B={b} H={h} N={s} D={d}: {name} vs torch fp32, max |diff| {(out - ref).abs().max().item():.3g}")
    del ref

    timing.settle()  # .ci/gpu runs the float64 tests just before: their clock drop passes first
    copy = max(timing.copy_bandwidths({"cute copy": kernels.copy_probe}).values())
    tf32 = tf32_gemm_tflops()
    fp32 = timing.gemm_tflops(torch.float32)
    print(f"copy {copy:.3f} TB/s; GEMM fp32 8192^3: TF32 {tf32:.0f} TFLOP/s, full fp32 {fp32:.0f}")

    impls["sdpa default"] = lambda: F.scaled_dot_product_attention(q, k, v)
    for name, backend in BACKENDS.items():

        def call(backend: SDPBackend = backend) -> object:
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v)

        try:
            call()
        except RuntimeError as e:
            print(f"{name}: not available for this problem ({str(e).splitlines()[0][:120]})")
            continue
        impls[name] = call
    print("\n| impl | ms (graph) | ms (eager) | TFLOP/s | % TF32 GEMM | TB/s | % copy |\n|---|---|---|---|---|---|---|")
    for name, call in impls.items():
        torch.cuda.synchronize()
        g = timing.time_calls([call], reps=10, graph=True)
        e = timing.time_calls([call], reps=10, graph=False)
        ms = max(g.median_ms, e.median_ms)  # a kernel is as fast as the slower of the two
        tf, tb = timing.tbs(flops, ms), timing.tbs(moved, ms)
        print(
            f"| {name} | {g.median_ms:.3f}{'' if g.graph else ' (no graph)'} | {e.median_ms:.3f} "
            f"| {tf:.0f} | {100 * tf / tf32:.1f} | {tb:.3f} | {100 * tb / copy:.1f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
