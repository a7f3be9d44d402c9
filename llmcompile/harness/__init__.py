"""The judge: the only way any kernel gets a verdict.

    static (here)  ->  compile (worker, CPU is enough)  ->  verify (worker, GPU)  ->  profile (worker, GPU)

`Judge.evaluate(source, spec, ...)` runs the stages asked for and returns a `Verdict`;
`Judge.evaluate_many` compiles several candidates in parallel CPU workers, then verifies
and profiles them one at a time on the GPU worker (timings must not share the GPU).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from llmcompile.harness import static
from llmcompile.harness.verdict import (
    COMPILE_ERROR,
    COMPILED,
    CRASHED,
    PROFILED,
    STAGES,
    STATIC_REJECTED,
    SUSPICIOUS,
    TIMEOUT,
    VERIFIED,
    WRONG,
    Verdict,
)
from llmcompile.harness.worker import Job, JobOutcome, Worker
from llmcompile.ops import HELD_OUT_N, OpSpec, verify_shapes

__all__ = ["Judge", "JudgeOptions", "Verdict", "evaluate", "STAGES"]


def gpu_available() -> bool:
    import torch

    return torch.cuda.is_available()


@dataclass
class JudgeOptions:
    """What to judge on. Shapes default to the spec's benchmark shapes (profile) and those
    plus held-out N at M = 1, odd and large (verify)."""

    stages: tuple[str, ...] = STAGES
    profile_shapes: list[tuple[int, int]] | None = None
    verify_ns: list[int] | None = None  # N to verify at (default: benchmark N + held-out N)
    baselines: list[str] = field(default_factory=list)
    seeds: int = 2

    def shapes_for(self, spec: OpSpec) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        prof = list(self.profile_shapes or spec.shapes())
        ns = self.verify_ns or ([n for _, n in prof] + list(HELD_OUT_N) if self.profile_shapes else None)
        return verify_shapes(spec, ns), prof


def source_sha(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def verdict_key(source: str, spec: OpSpec, dtype: str, target: str, opts: JudgeOptions) -> str:
    """Same source, problem and options: same verdict (a cache key for run stores)."""
    vs, ps = opts.shapes_for(spec)
    blob = json.dumps([source_sha(source), spec.ref, dtype, target, list(opts.stages), vs, ps, opts.baselines])
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


class Judge:
    def __init__(
        self,
        target: str = "h100",
        gpu: bool | None = None,
        compile_workers: int | None = None,
        timeouts: dict[str, float] | None = None,
    ) -> None:
        self.target = target
        self.gpu = gpu_available() if gpu is None else gpu
        self.timeouts = timeouts
        n = compile_workers or max(1, min(4, (os.cpu_count() or 2) // 2))
        # CPU workers never touch the GPU: compiling needs only CUTE_DSL_ARCH
        self.cpu_workers = [Worker(cuda_visible="", timeouts=timeouts) for _ in range(n)]
        self.gpu_worker = Worker(timeouts=timeouts) if self.gpu else None

    def close(self) -> None:
        for w in [*self.cpu_workers, self.gpu_worker]:
            if w is not None:
                w.close()

    def __enter__(self) -> Judge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ one candidate

    def _job(self, source: str, spec: OpSpec, dtype: str, opts: JudgeOptions, stages: list[str]) -> Job:
        vs, ps = opts.shapes_for(spec)
        ns = sorted({n for _, n in vs} | {n for _, n in ps})
        return Job(source, spec.ref, dtype, stages, ns, vs, ps, opts.baselines, opts.seeds)

    def evaluate(
        self, source: str, spec: OpSpec, dtype: str | None = None, opts: JudgeOptions | None = None
    ) -> Verdict:
        return self.evaluate_many([source], spec, dtype, opts)[0]

    def evaluate_many(
        self, sources: list[str], spec: OpSpec, dtype: str | None = None, opts: JudgeOptions | None = None
    ) -> list[Verdict]:
        opts = opts or JudgeOptions()
        dtype = dtype or spec.dtypes[0]
        spec.check_problem(1, 1, dtype)
        t0 = time.perf_counter()
        verdicts: list[Verdict | None] = [None] * len(sources)
        statics = [static.check_source(s) for s in sources]
        want_gpu = [s for s in opts.stages if s in ("verify", "profile")]
        if want_gpu and self.gpu:
            from llmcompile.targets import get_target, require_gpu

            require_gpu(get_target(self.target))
        todo = []
        for i, (src, st) in enumerate(zip(sources, statics)):
            base = Verdict("", "", spec.name, dtype, self.target, source_sha(src), static=st)
            if not st.ok:
                base.status = STATIC_REJECTED
                base.message = "the static check refused the source:\n" + "\n".join(f"- {p}" for p in st.problems)
                verdicts[i] = base
            elif "compile" in opts.stages or want_gpu:
                todo.append((i, base))
            else:
                base.status, base.message = COMPILED, "static check passed (no other stage asked for)"
                verdicts[i] = base

        # Compile in parallel on CPU workers (the GPU worker then hits the compile cache);
        # each thread owns one worker and takes every len(workers)-th candidate.
        nw = len(self.cpu_workers)

        def compile_share(k: int) -> list[tuple[int, JobOutcome]]:
            w = self.cpu_workers[k]
            return [(i, w.run(self._job(sources[i], spec, dtype, opts, ["compile"]))) for i, _ in todo[k::nw]]

        compiled: dict[int, JobOutcome] = {}
        if todo:
            with ThreadPoolExecutor(nw) as pool:
                for share in pool.map(compile_share, range(nw)):
                    compiled.update(dict(share))
        for i, base in todo:
            out = compiled[i]
            ok = out.failure is None and out.results.get("compile", {}).get("ok")
            if not ok or not want_gpu or self.gpu_worker is None:
                verdicts[i] = _finish(base, out, opts, self.gpu)
                continue
            gout = self.gpu_worker.run(self._job(sources[i], spec, dtype, opts, ["compile", *want_gpu]))
            # resources come from the CPU compile (the GPU worker's compile may be a cache hit)
            gout.results["compile"] = out.results["compile"]
            verdicts[i] = _finish(base, gout, opts, True)
        for v in verdicts:
            assert v is not None
            v.wall_s = time.perf_counter() - t0  # the batch's wall time: its candidates share workers
        return [v for v in verdicts if v is not None]


def _finish(v: Verdict, out: JobOutcome, opts: JudgeOptions, gpu: bool) -> Verdict:
    d = v.to_json()
    d.update({k: out.results.get(k) for k in ("compile", "verify", "profile")})
    v = Verdict.from_json(d)
    if out.failure:
        v.status = CRASHED if out.failure == "crashed" else TIMEOUT
        v.message = f"{v.status} during {out.stage}: {out.detail}".strip()
        return v
    if v.compile and not v.compile.ok:
        v.status, v.message = COMPILE_ERROR, "compile failed:\n" + v.compile.error
        return v
    if v.verify and not v.verify.ok:
        assert v.verify.failure is not None
        v.status, v.message = WRONG, "verification failed: " + v.verify.failure.describe()
        return v
    if v.profile and not v.profile.ok:
        v.status = SUSPICIOUS
        v.message = "profile rejected as physically implausible: " + "; ".join(v.profile.flags)
        return v
    if v.profile:
        per = ", ".join(f"N={s.n}: {s.tbs:.2f} TB/s ({s.pct_sol:.0f}%)" for s in v.profile.shapes)
        v.status = PROFILED
        v.message = (
            f"correct on {v.verify.runs if v.verify else 0} checked runs; speed vs the device copy "
            f"({v.profile.sol_tbs:.2f} TB/s): {per}; slowest {v.profile.min_pct_sol:.0f}% of SOL"
        )
        return v
    if v.verify:
        v.status = VERIFIED
        v.message = f"correct on {v.verify.runs} checked runs over {len(v.verify.shapes)} shapes (not profiled)"
        return v
    v.status = COMPILED
    usage = "; ".join(v.resources())
    asked = [s for s in opts.stages if s in ("verify", "profile")]
    why = " (no CUDA GPU visible: verify and profile need the target GPU)" if asked and not gpu else ""
    v.message = f"compiled for N={v.compile.n if v.compile else []}; {usage or 'no ptxas report'}{why}"
    return v


_DEFAULT: Judge | None = None


def evaluate(
    source: str,
    spec: OpSpec,
    target: str = "h100",
    stages: tuple[str, ...] = STAGES,
    dtype: str | None = None,
    **options: Any,
) -> Verdict:
    """One-call API: judge `source` on `spec` with a shared, warm Judge for `target`."""
    global _DEFAULT
    if _DEFAULT is None or _DEFAULT.target != target:
        if _DEFAULT is not None:
            _DEFAULT.close()
        _DEFAULT = Judge(target)
    return _DEFAULT.evaluate(source, spec, dtype, JudgeOptions(stages=stages, **options))
