"""The judge: the only way any kernel gets a verdict.

    static (here) -> compile (a fresh sandboxed candidate process) -> seal (judge worker: audit the
    host code, export the object file = the artifact) -> verify -> profile (GPU judge worker, which
    loads the artifact only)

`Judge.evaluate(source, spec, ...)` runs the stages asked for and returns a `Verdict`;
`Judge.evaluate_many` compiles several candidates in parallel, then verifies and profiles them
one at a time on the GPU worker (timings must not share the GPU). Candidate Python never runs
in a process that holds the judge's reference outputs or timers.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llmcompile import contract
from llmcompile.callpath import CallSpec
from llmcompile.harness import artifact, memplan, static
from llmcompile.harness.sandbox import sandbox
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
    CheckFailure,
    Verdict,
)
from llmcompile.harness.worker import CandidatePool, JobOutcome, JudgeFailure, judge_worker
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
        unsafe_no_sandbox: bool = False,
        artifact_root: str | Path | None = None,
    ) -> None:
        self.target = target
        self.gpu = gpu_available() if gpu is None else gpu
        self.timeouts = timeouts
        self.sandbox = sandbox(unsafe=unsafe_no_sandbox, gpu=self.gpu)
        self.compile_workers = compile_workers or max(1, min(4, (os.cpu_count() or 2) // 2))
        self.pool = CandidatePool(self.sandbox, warm=self.compile_workers, timeouts=timeouts)
        self.sealer = judge_worker(self.sandbox, gpu=False, timeouts=timeouts)
        self.gpu_worker = judge_worker(self.sandbox, gpu=True, timeouts=timeouts) if self.gpu else None
        self._own_root = artifact_root is None
        self.artifact_root = Path(artifact_root or tempfile.mkdtemp(prefix="llmcompile-artifacts-"))
        self._seal_lock = threading.Lock()

    def sandbox_facts(self) -> dict[str, Any]:
        """What isolation candidates get here, for run records and reports."""
        layers = self.sandbox.layers
        return {
            "layers": layers.active,
            "isolated": layers.namespaces,
            "gpu_worker_isolated": layers.gpu_namespaces if self.gpu else None,
            "unsafe_no_sandbox": self.sandbox.unsafe and not layers.namespaces,
            "problems": layers.problems,
        }

    def close(self) -> None:
        self.pool.close()
        for w in (self.sealer, self.gpu_worker):
            if w is not None:
                w.dispose()
        if self._own_root:
            shutil.rmtree(self.artifact_root, ignore_errors=True)

    def __enter__(self) -> Judge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ stages

    def _compile_and_seal(self, source: str, spec: OpSpec, dtype: str, ns: list[int]) -> JobOutcome:
        """Compile in a fresh sandboxed process, then seal its host modules into the artifact."""
        job = {"kind": "compile", "source": source, "dtype": dtype, "ns": ns}
        job["signature"] = contract.Signature.of(spec).to_json()
        out = self.pool.run(job)
        if out.failure or not out.results.get("compile", {}).get("ok"):
            return out
        with self._seal_lock:  # one sealer; sealing takes a fraction of a compile
            sealed = self.sealer.run({"kind": "seal", "modules": out.payload["modules"]})
        out.results["seal"] = sealed.results.get("seal", {"ok": False, "error": sealed.detail})
        if sealed.failure:
            raise JudgeFailure(f"the judge's sealing worker failed: {sealed.detail}")
        if out.results["seal"]["ok"]:
            try:  # the compile step ran candidate code: its word on the workspace is checked
                ws = contract.check_workspace(out.results["compile"].get("workspace", 0))
            except ValueError as e:
                out.results["seal"] = {"ok": False, "error": str(e)}
                return out
            out.payload = {"artifact": str(self._write_artifact(source, spec, dtype, sealed, ws))}
        return out

    def _write_artifact(self, source: str, spec: OpSpec, dtype: str, sealed: JobOutcome, workspace: int) -> Path:
        import base64

        objects = {n: base64.b64decode(b64) for n, b64 in sealed.payload["objects"].items()}
        man, files = artifact.manifest_for(
            spec.ref,
            dtype,
            objects,
            sealed.payload["launches"],
            [t.name for t in spec.tensors],
            list(spec.scalars),
            source,
            workspace,
            CallSpec.of(spec).to_json(),
        )
        key = hashlib.sha256(json.dumps([man.source_sha, man.op, dtype, list(objects)]).encode()).hexdigest()[:16]
        return artifact.write(self.artifact_root / key, man, files)

    def _gpu_job(self, art: str, spec: OpSpec, dtype: str, opts: JudgeOptions, stages: list[str]) -> dict[str, Any]:
        """The GPU worker's job for one artifact (verified with its inputs read-only)."""
        import base64

        d = Path(art)
        man = artifact.read(d)
        vs, ps = opts.shapes_for(spec)
        path = Path(spec.ref)
        return {
            "kind": "gpu",
            "op": path.name if path.suffix == ".py" else spec.ref,
            "problem_source": path.read_text() if path.suffix == ".py" else None,
            "dtype": dtype,
            "stages": stages,
            "manifest": asdict(man),
            "objects": {name: base64.b64encode((d / name).read_bytes()).decode() for name in man.objects.values()},
            "verify_shapes": vs,
            "profile_shapes": ps,
            "baselines": opts.baselines,
            "seeds": opts.seeds,
            "read_only": True,
        }

    def _attribute_fault(self, job: dict[str, Any], crashed: JobOutcome) -> JobOutcome:
        """A fault during verification, with the inputs read-only: verify again with them writable.
        A fault again is the kernel's own (an illegal address, a trap); a failed check is the
        verdict; a clean run means the only difference, writing into an input, was the fault."""
        again = self.gpu_worker.run({**job, "stages": ["verify"], "read_only": False})
        if again.failure or again.stage == "harness":
            return crashed
        v = again.results.get("verify")
        if v is None:
            return crashed
        if v["ok"]:
            at = crashed.at
            detail = (
                "wrote into an input: the kernel faulted when its inputs were mapped read-only "
                f"({crashed.detail.splitlines()[0][:160]}), and ran clean when they were writable, so it writes "
                "into an input (even one it puts back: anything reading that input meanwhile reads garbage)"
            )
            failure = CheckFailure("input_write", at.get("m", 0), at.get("n", 0), at.get("case", ""), 0, detail)
            v = {**v, "ok": False, "failure": asdict(failure)}
        return JobOutcome({"verify": v}, payload=crashed.payload)

    # ------------------------------------------------------------------ candidates

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
        vs, ps = opts.shapes_for(spec)
        if want_gpu and self.gpu_worker is not None:
            from llmcompile.targets import get_target, require_gpu

            require_gpu(get_target(self.target))
            # before any candidate: a problem too large for this GPU is said so, not blamed on one
            self.gpu_worker.wait_ready()
            assert self.gpu_worker.ready is not None
            gpu_total = self.gpu_worker.ready["gpu_total"]
            stages = memplan.plan(spec, dtype, vs if "verify" in want_gpu else [], ps if "profile" in want_gpu else [])
            memplan.check_fits(stages, gpu_total, self.gpu_worker.ready["gpu_name"])
        ns = sorted({n for _, n in vs} | {n for _, n in ps})
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

        # Compile in parallel, a fresh sandboxed process per candidate; each thread takes every
        # len(threads)-th candidate.
        nw = self.compile_workers

        def compile_share(k: int) -> list[tuple[int, JobOutcome]]:
            return [(i, self._compile_and_seal(sources[i], spec, dtype, ns)) for i, _ in todo[k::nw]]

        compiled: dict[int, JobOutcome] = {}
        if todo:
            with ThreadPoolExecutor(nw) as pool:
                for share in pool.map(compile_share, range(nw)):
                    compiled.update(dict(share))
        for i, base in todo:
            out = compiled[i]
            art = out.payload.get("artifact")
            if art is None or not want_gpu or self.gpu_worker is None:
                verdicts[i] = _finish(base, out, opts, self.gpu)
                continue
            job = self._gpu_job(art, spec, dtype, opts, want_gpu)
            gout = self.gpu_worker.run(job)
            if gout.failure == "crashed" and gout.stage == "verify":
                gout = self._attribute_fault(job, gout)
            if gout.stage == "harness":
                raise JudgeFailure(f"the judge failed on {spec.name} (not the candidate's doing): {gout.detail}")
            gout.results.update(out.results)
            gout.payload = out.payload
            verdicts[i] = _finish(base, gout, opts, True)
        for v in verdicts:
            assert v is not None
            v.wall_s = time.perf_counter() - t0  # the batch's wall time: its candidates share workers
        return [v for v in verdicts if v is not None]


def profiled_message(v: Verdict) -> str:
    """What a profiled verdict says first: its checks, then its speed against the limit."""
    p = v.profile
    assert p is not None
    per = ", ".join(f"N={s.n}: {s.tbs:.2f} {p.unit} ({s.pct_sol:.0f}%)" for s in p.shapes)
    checked = f"correct on {v.verify.runs} checked runs" if v.verify else "timed outputs correct (not re-verified)"
    return f"{checked}; speed vs the {p.limit} ({p.sol_tbs:.2f} {p.unit}): {per}; slowest {p.min_pct_sol:.0f}% of SOL"


def _finish(v: Verdict, out: JobOutcome, opts: JudgeOptions, gpu: bool) -> Verdict:
    d = v.to_json()
    d.update({k: out.results.get(k) for k in ("compile", "verify", "profile")})
    v = Verdict.from_json(d)
    v.artifact = out.payload.get("artifact")
    if out.failure:
        v.status = CRASHED if out.failure == "crashed" else TIMEOUT
        v.message = f"{v.status} during {out.stage}: {out.detail}".strip()
        return v
    if v.compile and not v.compile.ok:
        v.status, v.message = COMPILE_ERROR, "compile failed:\n" + v.compile.error
        return v
    seal = out.results.get("seal")
    if seal and not seal["ok"]:
        v.status, v.message = COMPILE_ERROR, "the compiled kernel was refused: " + seal["error"]
        return v
    if v.verify and not v.verify.ok:
        assert v.verify.failure is not None
        v.status, v.message = WRONG, "verification failed: " + v.verify.failure.describe()
        return v
    if v.profile and v.profile.failure:
        v.status = WRONG
        v.message = "the outputs of the timed calls are wrong: " + v.profile.failure.describe()
        return v
    if v.profile and not v.profile.ok:
        v.status = SUSPICIOUS
        v.message = "profile rejected as physically implausible: " + "; ".join(v.profile.flags)
        return v
    if v.profile:
        v.status = PROFILED
        v.message = profiled_message(v)
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
