"""Host time per eager call of each form a model calls an op in (GPU): scalars by keyword (the
default value and another), 3-D activations (batch, sequence, hidden), a slice of a wider tensor
(rows contiguous, the tensor not), an fp32 weight beside bf16 rows, and as a training step calls
it (autograd, the upstream gradient of `.sum()`, expanded), ours beside torch eager and QuACK on
the same tensors.

    python -m evals.scripts.call_forms [--dtype bfloat16] [--n 1024] [--out DIR]

At 8 x 1024 a kernel takes a few microseconds, so what is measured is the host's time per call:
the median over `--repeats` batches of `--calls` back-to-back calls, the implementations'
batches interleaved (`interleaved_us`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from llmcompile import kernels

Form = dict[str, Callable[[], object]]


def interleaved_us(fns: dict[str, Callable[[], object]], calls: int, repeats: int) -> dict[str, float]:
    """Median microseconds per call of each function, their batches interleaved (each repeat
    times every function once, in a rotated order), so that the host's slow spells, which on
    a shared machine last seconds, fall on all of them alike rather than on whichever ran then."""
    for fn in fns.values():
        for _ in range(50):
            fn()
    torch.cuda.synchronize()
    names = list(fns)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn = fns[name]
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            samples[name].append((time.perf_counter() - t0) * 1e6 / calls)
    return {name: statistics.median(v) for name, v in samples.items()}


def _quack() -> object | None:
    try:
        import quack

        return quack
    except Exception:  # noqa: BLE001 - absent: its column says n/a
        return None


def forms(dtype: torch.dtype, n: int) -> dict[str, Form]:
    """Each form: ours, torch eager and QuACK (where QuACK has the op) on the same tensors."""
    q = _quack()
    dev = "cuda"
    x2 = torch.randn(8, n, device=dev, dtype=dtype)
    x3 = torch.randn(2, 4, n, device=dev, dtype=dtype)
    wide = torch.randn(8, 2 * n, device=dev, dtype=dtype)
    xs = wide[:, :n]  # rows contiguous, the tensor strided
    w, b = torch.rand(n, device=dev, dtype=dtype), torch.rand(n, device=dev, dtype=dtype)
    wf = w.float()
    t2 = torch.randint(0, n, (8,), device=dev)
    t3 = torch.randint(0, n, (2, 4), device=dev)
    xg = x3.clone().requires_grad_()
    xg2 = x2.clone().requires_grad_()
    wg = w.clone().requires_grad_()
    out: dict[str, Form] = {}

    def add(
        name: str, ours: Callable[[], object], eager: Callable[[], object], quack: Callable[[], object] | None
    ) -> None:
        out[name] = {"llmcompile": ours, "torch eager": eager}
        if quack is not None:
            out[name]["quack"] = quack

    add("softmax(x) 8 x N", lambda: kernels.softmax(x2), lambda: torch.softmax(x2, -1), q and (lambda: q.softmax(x2)))
    add("softmax(x) 2 x 4 x N", lambda: kernels.softmax(x3), lambda: torch.softmax(x3, -1), None)
    add("softmax(x[:, :N]) a slice", lambda: kernels.softmax(xs), lambda: torch.softmax(xs, -1), None)
    add(
        "rmsnorm(x, w) 8 x N",
        lambda: kernels.rmsnorm(x2, w),
        lambda: F.rms_norm(x2, (n,), w, 1e-6),
        q and (lambda: q.rmsnorm(x2, wf, eps=1e-6)),
    )
    add("rmsnorm(x[:, :N], w) a slice", lambda: kernels.rmsnorm(xs, w), lambda: F.rms_norm(xs, (n,), w, 1e-6), None)
    for eps, said in ((1e-6, "1e-6) (the default)"), (1e-5, "1e-5)")):  # eps by keyword: its default, another
        add(
            f"rmsnorm(x, w, eps={said}",
            lambda e=eps: kernels.rmsnorm(x2, w, eps=e),
            lambda e=eps: F.rms_norm(x2, (n,), w, e),
            q and (lambda e=eps: q.rmsnorm(x2, wf, eps=e)),
        )
    add(
        "rmsnorm(x, w, eps=1e-5) 2 x 4 x N",
        lambda: kernels.rmsnorm(x3, w, eps=1e-5),
        lambda: F.rms_norm(x3, (n,), w, 1e-5),
        None,
    )
    add(
        "rmsnorm(x, w fp32, eps=1e-5) 8 x N",
        lambda: kernels.rmsnorm(x2, wf, eps=1e-5),
        lambda: F.rms_norm(x2, (n,), wf, 1e-5),
        q and (lambda: q.rmsnorm(x2, wf, eps=1e-5)),
    )
    add(
        "layernorm(x, w, b, eps=1e-5) 2 x 4 x N",
        lambda: kernels.layernorm(x3, w, b, eps=1e-5),
        lambda: F.layer_norm(x3, (n,), w, b, 1e-5),
        None,
    )
    add(
        "cross_entropy(x, t) 8 x N",
        lambda: kernels.cross_entropy(x2, t2),
        lambda: F.cross_entropy(x2, t2, reduction="none"),
        None,
    )
    add(
        "cross_entropy(x, t, ignore_index=0) 2 x 4 x N",
        lambda: kernels.cross_entropy(x3, t3, ignore_index=0),
        lambda: F.cross_entropy(x3.view(-1, n), t3.view(-1), ignore_index=0, reduction="none"),
        None,
    )
    add(
        "train: softmax(x).sum() backward, 2 x 4 x N",
        lambda: torch.autograd.grad(kernels.softmax(xg).sum(), xg),
        lambda: torch.autograd.grad(torch.softmax(xg, -1).sum(), xg),
        q and (lambda: torch.autograd.grad(q.softmax(xg.view(-1, n)).sum(), xg)),
    )
    add(
        "train: rmsnorm(x, w, eps=1e-5).sum() backward, 2 x 4 x N",
        lambda: torch.autograd.grad(kernels.rmsnorm(xg, wg, eps=1e-5).sum(), (xg, wg)),
        lambda: torch.autograd.grad(F.rms_norm(xg, (n,), wg, 1e-5).sum(), (xg, wg)),
        None,
    )
    add(
        "train: cross_entropy(x, t).sum() backward, 8 x N",
        lambda: torch.autograd.grad(kernels.cross_entropy(xg2, t2).sum(), xg2),
        lambda: torch.autograd.grad(F.cross_entropy(xg2, t2, reduction="none").sum(), xg2),
        q and (lambda: torch.autograd.grad(q.cross_entropy(xg2, t2, reduction="none").sum(), xg2)),
    )
    add(
        "train: cross_entropy_loss(x, t) backward (the mean), 8 x N",
        lambda: torch.autograd.grad(kernels.cross_entropy_loss(xg2, t2), xg2),
        lambda: torch.autograd.grad(F.cross_entropy(xg2, t2), xg2),
        None,
    )
    add(
        "cross_entropy_loss(x, t) without grad (the mean), 8 x N",
        lambda: kernels.cross_entropy_loss(x2, t2),
        lambda: F.cross_entropy(x2, t2),
        None,
    )
    qkv = torch.randn(3, 8, 1024, 64, device=dev, dtype=torch.bfloat16)  # (batch x heads, sequence, head dim)
    add(
        "attention_causal_d64(q, k, v) 8 x 1024 x 64, bf16",
        lambda: kernels.attention_causal_d64(*qkv),
        lambda: F.scaled_dot_product_attention(*qkv[:, None], is_causal=True),
        None,
    )
    # a model's: (batch, heads, sequence, head dim), v and the upstream gradient transposed views of
    # the projection's (batch, sequence, heads, head dim)
    qk = [torch.randn(2, 4, 1024, 64, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(2)]
    vb = torch.randn(2, 1024, 4, 64, device=dev, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(2, 1024, 4, 64, device=dev, dtype=torch.bfloat16).transpose(1, 2)
    q4, k4 = (t.detach() for t in qk)
    add(
        "attention_causal_d64(q, k, v) 2 x 4 x 1024 x 64, v strided, bf16",
        lambda: kernels.attention_causal_d64(q4, k4, vb.detach().transpose(1, 2)),
        lambda: F.scaled_dot_product_attention(q4, k4, vb.detach().transpose(1, 2), is_causal=True),
        None,
    )
    add(
        "train: attention_causal_d64(q, k, v) backward, 2 x 4 x 1024 x 64, v strided, bf16",
        lambda: torch.autograd.grad(kernels.attention_causal_d64(*qk, vb.transpose(1, 2))[0], (*qk, vb), dy),
        lambda: torch.autograd.grad(
            F.scaled_dot_product_attention(*qk, vb.transpose(1, 2), is_causal=True), (*qk, vb), dy
        ),
        None,
    )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--n", type=int, default=1024)
    p.add_argument("--calls", type=int, default=500)
    p.add_argument("--repeats", type=int, default=11)
    p.add_argument("--out", default=".")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: dict[str, dict[str, float | str]] = {}
    for name, impls in forms(getattr(torch, args.dtype), args.n).items():
        ok: Form = {}
        for impl, fn in impls.items():
            try:
                fn()
                ok[impl] = fn
            except Exception as e:  # noqa: BLE001 - a form an implementation cannot take is reported
                rows.setdefault(name, {})[impl] = f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"
        for impl, us in interleaved_us(ok, args.calls, args.repeats).items():
            rows.setdefault(name, {})[impl] = round(us, 2)
        print(name, rows[name], flush=True)
    cols = ["llmcompile", "torch eager", "quack"]
    lines = [
        f"Host time per eager call (us, median of {args.repeats} x {args.calls} calls, no CUDA graph), "
        f"{args.dtype}, N = {args.n}, {torch.cuda.get_device_name(0)}, torch {torch.__version__}",
        "",
        "| form | " + " | ".join(cols) + " | ours / eager |",
        "|---|" + "---|" * (len(cols) + 1),
    ]
    for name, r in rows.items():
        ours, eager = r.get("llmcompile"), r.get("torch eager")
        ratio = f"{ours / eager:.2f}" if isinstance(ours, float) and isinstance(eager, float) else "n/a"
        lines.append(f"| {name} | " + " | ".join(str(r.get(c, "n/a")) for c in cols) + f" | {ratio} |")
    (out / "call-forms.md").write_text("\n".join(lines) + "\n")
    (out / "call-forms.json").write_text(json.dumps(rows, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
