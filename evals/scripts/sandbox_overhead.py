"""What the sandbox adds to the judge's wall time per candidate.

    python -m evals.scripts.sandbox_overhead [--rounds 5] [--op softmax] [--dtype bfloat16] [--stages static,compile]

Two judges with the same process model (a fresh candidate process per candidate, the same sealing
and GPU workers) differ only in the isolation layers: one with every layer this machine allows,
one with none (`--unsafe-no-sandbox` on a machine without namespaces). Each judges the reference
kernel `rounds` times, alternating, after one warm-up each; the medians are compared. Without a
GPU the stages default to static + compile; with one, to all four.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from llmcompile.harness import STAGES, Judge, JudgeOptions, gpu_available
from llmcompile.harness.compile_cache import NoCache
from llmcompile.harness.sandbox import Layers, Sandbox
from llmcompile.specs import get_op

REF = Path(__file__).resolve().parents[2] / "reference_kernels"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--op", default="softmax")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--stages", help="comma list (default: all four with a GPU, else static,compile)")
    args = ap.parse_args()
    gpu = gpu_available()
    stages = tuple(args.stages.split(",")) if args.stages else STAGES if gpu else ("static", "compile")
    spec = get_op(args.op)
    src = (REF / f"{spec.reference_module}.py").read_text()
    opts = JudgeOptions(stages=stages)
    # (no compile cache: each round compiles, as a new candidate would)
    judges = {
        "sandboxed": Judge(gpu=gpu, cache=NoCache()),
        "unsandboxed": Judge(gpu=gpu, cache=NoCache(), isolation=Sandbox(Layers(), unsafe=True)),
    }
    times: dict[str, list[float]] = {k: [] for k in judges}
    stages_s: dict[str, list[dict[str, float]]] = {k: [] for k in judges}
    try:
        for j in judges.values():  # warm-up: workers started, bandwidth measured
            v = j.evaluate(src, spec, args.dtype, opts)
            assert v.passed, v.message
        for _ in range(args.rounds):
            for name, j in judges.items():
                t0 = time.perf_counter()
                v = j.evaluate(src, spec, args.dtype, opts)
                times[name].append(time.perf_counter() - t0)
                assert v.passed, v.message
                parts = {"compile": v.compile, "verify": v.verify, "profile": v.profile}
                stages_s[name].append({k: round(r.seconds, 2) for k, r in parts.items() if r is not None})
        layers = judges["sandboxed"].sandbox_facts()
    finally:
        for j in judges.values():
            j.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    # rounds alternate the two judges: the median of each round's ratio is robust to drift
    paired = statistics.median(a / b for a, b in zip(times["sandboxed"], times["unsandboxed"]))
    result = {
        "op": spec.name, "dtype": args.dtype, "stages": list(stages), "gpu": gpu, "rounds": args.rounds,
        "seconds": times, "stage_seconds": stages_s, "median_s": med,
        "overhead_pct": 100 * (med["sandboxed"] / med["unsandboxed"] - 1), "paired_overhead_pct": 100 * (paired - 1),
        "sandbox": layers,
    }  # fmt: skip
    line = (
        f"{spec.name} {args.dtype} [{','.join(stages)}]: sandboxed {med['sandboxed']:.2f} s, "
        f"unsandboxed {med['unsandboxed']:.2f} s per candidate (median of {args.rounds}): "
        f"{result['overhead_pct']:+.1f}% (median of paired rounds: {result['paired_overhead_pct']:+.1f}%); "
        f"layers: {', '.join(layers['layers'])}"
        + ("" if not gpu else f"; GPU worker isolated: {layers['gpu_worker_isolated']}")
    )
    print(line)
    out = os.environ.get("LLMCOMPILE_RESULTS_DIR")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, f"sandbox-overhead-{'gpu' if gpu else 'cpu'}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
