"""What one call costs the host (GPU): microseconds per eager call, no CUDA graph, at a size where
the kernel itself takes a few microseconds, so the host's time per call is what is measured.

    python -m evals.scripts.host_overhead [--shape 8x1024] [--calls 2000] [--out DIR]

For softmax, rmsnorm, layernorm and cross_entropy (bf16): `llmcompile.kernels.<op>` (the lean
call path, entered in C, outputs made in C), the same call entered through its Python
`__call__`, the same kernel with its outputs made from Python (the path before `native_call`),
the same reference kernel exported and loaded through TVM-FFI alone
(`llmcompile.loader`), QuACK and torch eager, in one process on the same inputs. Each figure is
the median over `--repeats` batches of `--calls` back-to-back calls, the functions' batches
interleaved, wall clock around a synchronize, after a warm-up. Then, in a fresh process that cannot import CuTe DSL
(`evals.scripts.fresh_load`), the time from `load(DIR)` to the first call's result.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from llmcompile import kernels, loader
from llmcompile.bench import baselines
from llmcompile.runtime import callpath, export, native_call
from llmcompile.specs import get_op, parse_shape

OPS = ("softmax", "rmsnorm", "layernorm", "cross_entropy")


def per_call_us(fn: Callable[[], object], calls: int, repeats: int) -> float:
    return interleaved_us({"": fn}, calls, repeats)[""]


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


def _python_allocating(kfn: callpath.KernelFunction, ins: list[torch.Tensor]) -> callpath.KernelFunction:
    """The same compiled kernel behind the same call path, with the path's Python fast function
    (torch.empty_like's outputs) in place of the C one: what a call cost before `native_call`."""
    twin = callpath.KernelFunction(kfn.spec, kfn.compiled)
    twin.grad_fn = kfn.grad_fn  # the same checks a call makes
    twin(*ins)  # the checked call, which plans
    for key, plan in twin._plans.items():
        twin._fast[(*key, 2)] = callpath._fast_function(plan)
    if hasattr(twin, "_clear_calls"):  # its calls start in Python, which finds the Python function
        twin._clear_calls()
    return twin


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="8x1024")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=21)
    p.add_argument("--out", default=".")
    args = p.parse_args(argv)
    m, n = parse_shape(args.shape)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: dict[str, dict[str, float | str]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="llmcompile-export-"))
    for op in OPS:
        spec = get_op(op)
        gen = torch.Generator().manual_seed(0)
        ins = spec.make_inputs(m, n, args.dtype, gen, "random", "cuda")
        want = kernels.BY_NAME[op](*ins)
        art = tmp / op
        export.export_op(op, args.dtype, [n], art)
        shipped = loader.load(art)
        got = shipped(*ins)
        same = all(
            torch.equal(a, b)
            for a, b in zip(want if isinstance(want, list) else [want], got if isinstance(got, list) else [got])
        )
        kfn = kernels.BY_NAME[op]
        impls: dict[str, Callable[[], object]] = {
            "llmcompile.kernels": lambda f=kfn, i=ins: f(*i),
            "through Python __call__": lambda f=kfn, i=ins: callpath.KernelFunction.__call__(f, *i),
            "outputs from Python": lambda f=_python_allocating(kfn, ins), i=ins: f(*i),
            "exported (TVM-FFI only)": lambda f=shipped, i=ins: f(*i),
        }
        for name in ("quack", "eager"):
            try:
                impls[name] = baselines.BASELINES[name](spec, ins, dict(spec.scalars))
            except baselines.Unavailable as e:
                rows.setdefault(op, {})[name] = str(e)
        for name, us in interleaved_us(impls, args.calls, args.repeats).items():
            rows.setdefault(op, {})[name] = round(us, 2)
        rows[op]["exported output == kernels output"] = str(same)
        print(op, rows[op], flush=True)
    fresh = {}
    for op in OPS:
        done = subprocess.run(
            [sys.executable, "-m", "evals.scripts.fresh_load", str(tmp / op)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        fresh[op] = (done.stdout.strip().splitlines() or [""])[-1] + (
            f" (rc {done.returncode}: {done.stderr[-400:]})" if done.returncode else ""
        )
        print("fresh process:", op, fresh[op], flush=True)
    names = [
        "llmcompile.kernels",
        "through Python __call__",
        "outputs from Python",
        "exported (TVM-FFI only)",
        "quack",
        "eager",
    ]
    lines = [
        f"Host time per eager call (us, median of {args.repeats} x {args.calls} calls, no CUDA graph), "
        f"{args.dtype} {m} x {n}, {torch.cuda.get_device_name(0)}, torch {torch.__version__}",
        "",
        f"llmcompile.kernels makes a call's outputs in C: {native_call.available() or native_call.reason()}; "
        "'through Python __call__' is the same call entered in Python, not in C (the path before the C entry); "
        "'outputs from Python' is the same kernel through the same call path with torch.empty_like's outputs",
        "",
        "| op | " + " | ".join(names) + " | exported == kernels |",
        "|---|" + "---|" * (len(names) + 1),
    ]
    for op, r in rows.items():
        lines.append(
            f"| {op} | "
            + " | ".join(str(r.get(k, "n/a")) for k in names)
            + f" | {r['exported output == kernels output']} |"
        )
    lines += ["", "Fresh process without CuTe DSL: load(DIR) to the first call's result", ""]
    lines += [f"- {op}: {line}" for op, line in fresh.items()]
    (out / "host-overhead.md").write_text("\n".join(lines) + "\n")
    (out / "host-overhead.json").write_text(json.dumps({"rows": rows, "fresh": fresh}, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
