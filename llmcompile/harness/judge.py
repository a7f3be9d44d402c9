"""The judge: the only way any kernel gets a verdict.

    static (here) -> compile (fresh sandboxed candidate processes, each N's share in parallel) ->
    seal (judge workers: audit the host code, export the object file = the artifact) -> verify ->
    profile (GPU judge worker, which loads the artifact only)

`Judge.evaluate(source, spec, ...)` runs the stages asked for and returns a `Verdict`;
`Judge.evaluate_many` compiles several candidates in parallel and feeds each to the GPU worker as
soon as it is sealed, one at a time (timings must not share the GPU), while the rest compile.
Each N's sealed kernel is kept by what it was compiled from (`compile_cache.py`): a source judged
again (the best re-timed beside the baselines, a resumed run, another eval) is not compiled again.
Candidate Python never runs in a process that holds the judge's reference outputs or timers.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llmcompile.harness import baseline_cache, compile_cache, early, gpu_turn, memplan, static
from llmcompile.harness.cpus import host_cpus
from llmcompile.harness.sandbox import Sandbox, sandbox
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
    CompileResult,
    KernelResources,
    Verdict,
)
from llmcompile.harness.worker import CandidatePool, Channel, JobOutcome, JudgeFailure, judge_worker
from llmcompile.runtime import artifact
from llmcompile.runtime.callspec import CallSpec
from llmcompile.specs import HELD_OUT_N, OpSpec, contract, verify_shapes
from llmcompile.specs.targets import DEFAULT_TARGET

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
        target: str = DEFAULT_TARGET,
        gpu: bool | None = None,
        compile_workers: int | None = None,
        timeouts: dict[str, float] | None = None,
        unsafe_no_sandbox: bool = False,
        artifact_root: str | Path | None = None,
        cache: compile_cache.CompileCache | None = None,
        baselines: baseline_cache.BaselineCache | None = None,
        isolation: Sandbox | None = None,
    ) -> None:
        """`isolation`: the sandbox to run processes in, in place of the one this machine allows
        (evals/scripts/sandbox_overhead.py measures the judge with none)."""
        self.target = target
        self.gpu = gpu_available() if gpu is None else gpu
        self.timeouts = timeouts
        # the GPU worker `llmcompile.entry` started before the agent's imports, where it is ours
        started = early.take(unsafe_no_sandbox) if self.gpu and isolation is None and timeouts is None else None
        if started is None:
            early.close()
        self.sandbox = started[0] if started else isolation or sandbox(unsafe=unsafe_no_sandbox, gpu=self.gpu)
        cpus = host_cpus()
        # candidates compiled at once, and processes each spreads its N over: about one a core
        self.compile_workers = compile_workers or max(1, min(4, cpus // 2))
        self.parts = max(1, (cpus - 2) // self.compile_workers)
        self.pool = CandidatePool(self.sandbox, warm=self.compile_workers * self.parts, timeouts=timeouts)
        self._sealers: queue.Queue[Channel] = queue.Queue()
        for _ in range(self.compile_workers):
            self._sealers.put(judge_worker(self.sandbox, gpu=False, timeouts=timeouts))
        self.gpu_worker: Channel | None = None
        if started:
            self.gpu_worker = started[1]
        elif self.gpu:
            self.gpu_worker = judge_worker(self.sandbox, gpu=True, timeouts=timeouts)
        self._own_root = artifact_root is None
        self.artifact_root = Path(artifact_root or tempfile.mkdtemp(prefix="llmcompile-artifacts-"))
        self.cache = cache or compile_cache.CompileCache()
        self.baselines = baselines or baseline_cache.BaselineCache()
        self._gpu_lock = threading.Lock()  # every exchange with the GPU worker, its start-up included
        self._warmed_at = 0.0
        self._gpu_released = False
        self._lending = False  # the run waits on an LLM: a shared GPU's turn is lent while idle
        # Start every process now: they come up (imports, a CUDA context, the bandwidth measured)
        # while the caller prepares its first candidates, not in front of them.
        for w in self._sealers.queue:
            w.start()
        self.pool.prestart()
        if self.gpu_worker is not None:
            if not started:
                self.gpu_worker.start()
            threading.Thread(target=self._warm_gpu, daemon=True, name="llmcompile-gpu-warm").start()

    def _warm_gpu(self) -> None:
        try:
            with self._gpu_lock:
                self._worker().run({"kind": "warm"})
                self._warmed_at = time.time()
                if self._lending:  # (asked while it warmed up)
                    self._lend()
        except Exception:  # noqa: BLE001 - a worker that cannot start says so when a candidate needs it
            pass

    def lend_gpu(self) -> None:
        """The run waits on something else now (an LLM's answers): where its GPU is shared with
        other runs (gpu_turn.py), the next of them may verify and time on it meanwhile. Lent at once
        where the GPU worker is idle, else as soon as its start-up is done; `want_gpu`, or the next
        exchange, asks for it back."""
        self._lending = True
        if self._gpu_lock.acquire(blocking=False):
            try:
                self._lend()
            except Exception:  # noqa: BLE001 - a GPU worker in trouble says so when a candidate needs it
                pass
            finally:
                self._gpu_lock.release()

    def want_gpu(self) -> None:
        """The run will need its GPU soon (its LLM answered): a lent turn is asked for again now, in
        the background, so the wait overlaps the compile."""
        self._lending = False
        if self.turn is not None:
            self.turn.resume()

    def _lend(self) -> None:
        """Under `_gpu_lock`: the GPU worker frees the input sets it keeps (the memory is the other
        run's meanwhile; its CUDA context and the bandwidth it measured stay), then the turn is
        lent. Nothing is lent where the turn is not held now, or the worker did not rest."""
        t = self.turn
        if t is None or not t.held or self._gpu_released or self.gpu_worker is None or self.gpu_worker.ready is None:
            return
        if self.gpu_worker.run({"kind": "rest"}).results.get("rest") is not None:
            t.pause()

    @property
    def turn(self) -> gpu_turn.Turn | None:
        """This run's turn on a GPU it shares with other runs (None: the GPU is its alone)."""
        return self.gpu_worker.turn if self.gpu_worker is not None else None

    def turn_wait(self, since: float) -> float:
        """Seconds (perf_counter) this run has waited since `since` for its turn on a GPU it shares
        with other runs: not its own time (an agent's time budget leaves it out)."""
        return self.turn.waited(since) if self.turn is not None else 0.0

    def start_facts(self) -> dict[str, float]:
        """When the GPU worker was started, was given this run's turn on a GPU shared with other
        runs (where it waits for one), said it was ready (imports, a CUDA context) and had measured
        the device's bandwidth (time.time(); those it has not reached are left out): a run's first
        candidates wait for the last of them. And how long the run lent its turn (`lend_gpu`)."""
        w = self.gpu_worker
        if w is None:
            return {}
        out = {"gpu_spawned": w.spawned_at}
        if w.turn is not None and w.turn.taken_at is not None:
            out["gpu_turn"] = w.turn.taken_at
        if w.ready is not None and "at" in w.ready:
            out["gpu_ready"] = float(w.ready["at"])
        if self._warmed_at:
            out["gpu_warmed"] = self._warmed_at
        if w.turn is not None and w.turn.lent_for():
            out["gpu_lent_s"] = round(w.turn.lent_for(), 2)  # (seconds: lent while the LLM answered)
        return out

    def gpu_facts(self) -> dict[str, Any]:
        """The GPU worker's `ready` facts (its GPU's memory and name, the software versions)."""
        with self._gpu_lock:
            w = self._worker()
            w.wait_ready()
            assert w.ready is not None
            return w.ready

    def release_gpu(self) -> None:
        """This run will verify and time nothing more: its GPU worker ends now, and the GPU's turn
        passes to the next run on it (gpu_turn.py) while this one writes its report."""
        self._gpu_released = True
        w = self.gpu_worker
        if w is not None and w.turn is not None and w.turn.taken is None:
            w.turn.release()  # not yet this run's: a start waiting for it stops (and frees the lock)
        with self._gpu_lock:
            if w is not None:
                w.dispose()

    def _worker(self) -> Channel:
        """The GPU worker, for an exchange under `_gpu_lock`: where the run lent its turn, once the
        turn is the run's again."""
        if self._gpu_released:  # (its turn may be another run's by now)
            raise JudgeFailure("the judge gave its GPU up (release_gpu) and was then asked to use it: our bug")
        assert self.gpu_worker is not None
        t = self.gpu_worker.turn
        if t is not None and t.coming_back:  # lent (`lend_gpu`): back first
            t.resume()
            if not t.wait():
                raise JudgeFailure(
                    "the GPU's turn, lent while the run waited on its LLM, was given up before it came back"
                )
        return self.gpu_worker

    @property
    def sealer(self) -> Channel:
        """One of the sealing workers (for a job of the caller's own, such as a ping)."""
        return self._sealers.queue[0]

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
        for w in [*list(self._sealers.queue), self.gpu_worker]:
            if w is not None:
                w.dispose()
        if self._own_root:
            shutil.rmtree(self.artifact_root, ignore_errors=True)

    def __enter__(self) -> Judge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ stages

    def _compile_and_seal(
        self, source: str, spec: OpSpec, dtype: str, ns: list[int], clock: dict[str, float]
    ) -> JobOutcome:
        """Each N's sealed kernel from the compile cache, or compiled in fresh sandboxed processes
        (its N spread over `self.parts` of them) and sealed; then the artifact. `clock` gets the
        compile and seal seconds."""
        sig = contract.Signature.of(spec).to_json()
        arch = os.environ.get("CUTE_DSL_ARCH", contract.DEFAULT_ARCH)
        keys = {n: compile_cache.key(source, sig, dtype, n, arch) for n in ns}
        entries = {n: e for n in ns if (e := self.cache.get(keys[n])) is not None}
        todo = [n for n in ns if n not in entries]
        t0 = time.perf_counter()
        parts = [todo[i :: self.parts] for i in range(min(self.parts, len(todo)))]
        jobs = [{"kind": "compile", "source": source, "dtype": dtype, "ns": part, "signature": sig} for part in parts]
        with ThreadPoolExecutor(max(1, len(jobs))) as ex:
            outs = list(ex.map(self.pool.run, jobs))
        clock["compile"] = time.perf_counter() - t0
        merged = _merged(outs, entries, ns)
        if merged.failure or not merged.results["compile"]["ok"]:
            return merged
        modules = {n: text for o in outs for n, text in o.payload["modules"].items()}
        t0 = time.perf_counter()
        if modules:
            sealer = self._sealers.get()
            try:
                sealed = sealer.run({"kind": "seal", "modules": modules})
            finally:
                self._sealers.put(sealer)
            merged.results["seal"] = sealed.results.get("seal", {"ok": False, "error": sealed.detail})
            if sealed.failure:
                raise JudgeFailure(f"the judge's sealing worker failed: {sealed.detail}")
            if not merged.results["seal"]["ok"]:
                return merged
        clock["seal"] = time.perf_counter() - t0
        try:  # the compile step ran candidate code: its word on the workspace is checked
            ws = contract.check_workspace(merged.results["compile"].get("workspace", 0))
        except ValueError as e:
            merged.results["seal"] = {"ok": False, "error": str(e)}
            return merged
        import base64

        by_n = {int(n): r for n, r in merged.results["compile"].get("kernels_by_n", {}).items()}
        for n, b64 in sealed.payload["objects"].items() if modules else ():
            entry = compile_cache.Entry(
                base64.b64decode(b64),
                sealed.payload["launches"][n],
                [KernelResources(**r) for r in by_n.get(int(n), [])],
                ws,
            )
            entries[int(n)] = entry
            self.cache.put(keys[int(n)], entry)
        merged.results.setdefault("seal", {"ok": True, "error": ""})
        merged.payload = {"artifact": str(self._write_artifact(source, spec, dtype, entries, ws))}
        return merged

    def _write_artifact(
        self, source: str, spec: OpSpec, dtype: str, entries: dict[int, compile_cache.Entry], workspace: int
    ) -> Path:
        objects = {str(n): e.obj for n, e in sorted(entries.items())}
        man, files = artifact.manifest_for(
            spec.ref,
            dtype,
            objects,
            {str(n): e.launches for n, e in entries.items()},
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
            "independent_rows": spec.independent_rows,  # (found on CPU here: not again there)
            "dtype": dtype,
            "stages": stages,
            "manifest": asdict(man),
            "objects": {name: base64.b64encode((d / name).read_bytes()).decode() for name in man.objects.values()},
            "verify_shapes": vs,
            "profile_shapes": ps,
            "baselines": opts.baselines,
            "seeds": opts.seeds,
            "read_only": True,
            "baseline_cache": self._cached_baselines(spec, dtype, ps if "profile" in stages else [], opts.baselines),
        }

    def _baseline_keys(self, spec: OpSpec, dtype: str, m: int, n: int, names: list[str]) -> dict[str, str]:
        machine = self.gpu_facts().get("versions", {})
        return {b: baseline_cache.key(machine, spec.ref, dtype, m, n, b) for b in names}

    def _cached_baselines(
        self, spec: OpSpec, dtype: str, shapes: list[tuple[int, int]], names: list[str]
    ) -> dict[str, dict[str, dict[str, float]]]:
        """ "MxN" -> baseline -> {ms, tbs, age_s}: the baselines timed on this machine before."""
        if not names or self.gpu_worker is None:
            return {}
        now = time.time()
        out = {}
        for m, n in shapes:
            found = self.baselines.lookup(self._baseline_keys(spec, dtype, m, n, names))
            if found:
                out[f"{m}x{n}"] = {b: {"ms": e["ms"], "tbs": e["tbs"], "age_s": now - e["t"]} for b, e in found.items()}
        return out

    def _store_baselines(self, spec: OpSpec, dtype: str, profile: dict[str, Any] | None, names: list[str]) -> None:
        """Keep the baselines this profile timed (not those it took from the cache), where their
        timing was sound: none flagged, and the GPU the judge's alone right after them."""
        if not profile or not names or profile.get("disturbed"):
            return
        entries = {}
        for sh in profile.get("shapes", []):
            keys = self._baseline_keys(spec, dtype, sh["m"], sh["n"], names)
            skip = sh.get("baseline_age_s", {}).keys() | sh.get("baseline_notes", {}).keys()
            for b, k in keys.items():
                if b in sh["baselines"] and b not in skip:
                    entries[k] = {"ms": sh["baseline_ms"][b], "tbs": sh["baselines"][b], "t": time.time()}
        self.baselines.store(entries)

    def _attribute_fault(self, job: dict[str, Any], crashed: JobOutcome) -> JobOutcome:
        """A fault with the inputs read-only (during verification, or while the candidate was
        timed: not while the baselines were, nor the checks): that stage again with them
        writable; a timing again at the shape it faulted on, without baselines. A fault again is
        the kernel's own (an illegal address, a trap); a failed check is the verdict; a clean
        run means the only difference, writing into an input, was the fault."""
        stage = crashed.stage or "verify"
        at = crashed.at
        if stage == "profile" and at.get("case") != "timed":
            return crashed  # (not in the candidate's read-only run: the baselines', the checks')
        again_job = {**job, "stages": [stage], "read_only": False}
        if stage == "profile":
            again_job["profile_shapes"] = [[at["m"], at["n"]]]
            again_job["baselines"], again_job["baseline_cache"] = [], {}
        again = self.gpu_worker.run(again_job)
        if again.failure or again.stage == "harness":
            return crashed
        r = again.results.get(stage)
        if r is None:
            return crashed
        fault = crashed.detail.splitlines()[0][:160] if crashed.detail else "a fault"
        when = " while it was timed" if stage == "profile" else ""
        if r.get("failure") is None:  # (a profile's flags alone: the fault is still the difference)
            detail = (
                f"wrote into an input{when}: the kernel faulted when its inputs were mapped read-only ({fault}), "
                "and ran clean when they were writable, so it writes into an input (even one it puts back: "
                "anything reading that input meanwhile reads garbage)"
            )
            failure = CheckFailure("input_write", at.get("m", 0), at.get("n", 0), at.get("case", ""), 0, detail)
            r = {**r, "ok": False, "failure": asdict(failure)}
        elif r["failure"]["check"] not in ("out_of_bounds_write", "input_modified"):  # (those name the input)
            f = r["failure"]
            f["detail"] = (
                f"wrote into an input{when}: it faulted when its inputs were mapped read-only ({fault}); with "
                f"them writable it fails this check ({f['check']}): {f['detail']}"
            )
            f["check"] = "input_write"
        return JobOutcome({**crashed.results, stage: r}, payload=crashed.payload)

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
        clocks: list[dict[str, float]] = [{} for _ in sources]
        statics = []
        for src, clock in zip(sources, clocks):
            ts = time.perf_counter()
            statics.append(static.check_source(src))
            clock["static"] = time.perf_counter() - ts
        want_gpu = [s for s in opts.stages if s in ("verify", "profile")]
        vs, ps = opts.shapes_for(spec)
        if want_gpu and self.gpu_worker is not None:
            from llmcompile.specs.targets import get_target, require_gpu

            require_gpu(get_target(self.target))
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

        # Compile in parallel, each candidate its own sandboxed processes; each is handed to the
        # GPU worker, in order, as soon as it is sealed, while the ones after it still compile.
        with ThreadPoolExecutor(self.compile_workers) as pool:
            futures = {i: pool.submit(self._compile_and_seal, sources[i], spec, dtype, ns, clocks[i]) for i, _ in todo}
            # when each was sealed: its wait for the GPU worker counts from then, the worker's
            # start-up and first bandwidth measurement included (a fresh judge's first candidates)
            sealed_at: dict[int, float] = {}
            for i, f in futures.items():
                f.add_done_callback(lambda _, i=i: sealed_at.setdefault(i, time.perf_counter()))
            if want_gpu and self.gpu_worker is not None and todo:
                # while they compile: a problem too large for this GPU is said so, not blamed on one
                facts = self.gpu_facts()
                stages = memplan.plan(
                    spec, dtype, vs if "verify" in want_gpu else [], ps if "profile" in want_gpu else []
                )
                memplan.check_fits(stages, facts["gpu_total"], facts["gpu_name"])
            for i, base in todo:
                out = futures[i].result()
                ready = sealed_at.get(i, time.perf_counter())
                verdicts[i] = self._gpu_stages(out, base, spec, dtype, opts, want_gpu, clocks[i], ready)
                verdicts[i].finished_at = time.time()
        for v, clock in zip(verdicts, clocks):
            assert v is not None
            v.wall_s = time.perf_counter() - t0  # the batch's wall time: its candidates share workers
            v.timeline = {k: round(x, 3) for k, x in clock.items()}
            v.finished_at = v.finished_at or time.time()
        return [v for v in verdicts if v is not None]

    def _gpu_stages(
        self,
        out: JobOutcome,
        base: Verdict,
        spec: OpSpec,
        dtype: str,
        opts: JudgeOptions,
        want_gpu: list[str],
        clock: dict[str, float],
        ready: float,
    ) -> Verdict:
        """Verify and profile one compiled candidate on the GPU worker (when asked and possible)."""
        art = out.payload.get("artifact")
        if art is None or not want_gpu or self.gpu_worker is None:
            return _finish(base, out, opts, self.gpu)
        job = self._gpu_job(art, spec, dtype, opts, want_gpu)
        with self._gpu_lock:
            # from when it was sealed, or the GPU became this run's (gpu_turn.py), the later
            w = self._worker()
            clock["gpu_wait"] = time.perf_counter() - (max(ready, w.turn.taken or 0.0) if w.turn else ready)
            gout = w.run(job)
            if gout.failure == "crashed" and gout.stage in ("verify", "profile"):
                ta = time.perf_counter()
                gout = self._attribute_fault(job, gout)
                clock["attribute"] = time.perf_counter() - ta
        if gout.stage == "harness":
            raise JudgeFailure(f"the judge failed on {spec.name} (not the candidate's doing): {gout.detail}")
        for stage in ("load", "verify", "profile"):
            if gout.results.get(stage):
                clock[stage] = gout.results[stage].get("seconds", 0.0)
        for phase, s in ((gout.results.get("profile") or {}).get("phases_s") or {}).items():
            clock[f"profile.{phase}"] = s  # (within "profile", not beside it: report.timeline_of)
        self._store_baselines(spec, dtype, gout.results.get("profile"), opts.baselines)
        gout.results.update(out.results)
        gout.payload = out.payload
        return _finish(base, gout, opts, True)


def _merged(outs: list[JobOutcome], cached: dict[int, compile_cache.Entry], ns: list[int]) -> JobOutcome:
    """One candidate's compile result from its parts' (and the N the cache held): failed if any
    part failed (its error, first), else every N with the largest N's resources."""
    for o in outs:
        if o.failure or not o.results.get("compile", {}).get("ok"):
            return o
    by_n: dict[str, Any] = {}
    workspace = 0
    seconds = 0.0
    for o in outs:
        c = o.results["compile"]
        by_n.update({str(n): ks for n, ks in c.get("kernels_by_n", {}).items()})
        workspace = c.get("workspace", workspace)
        seconds = max(seconds, c.get("seconds", 0.0))
    for n, e in cached.items():
        by_n[str(n)] = [asdict(k) for k in e.kernels]
        workspace = e.workspace if not outs else workspace
    largest = str(max(ns))
    result = CompileResult(True, list(ns), "", [], seconds, workspace, {}, sorted(cached))
    data = asdict(result)
    data["kernels"], data["kernels_by_n"] = by_n.get(largest, []), by_n
    return JobOutcome({"compile": data})


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
        what = "the timed calls wrote into an input" if v.profile.failure.check == "input_write" else "the outputs of the timed calls are wrong"  # fmt: skip
        v.message = f"{what}: {v.profile.failure.describe()}"
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
    target: str = DEFAULT_TARGET,
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
