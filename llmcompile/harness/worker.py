"""The processes the judge talks to, and the protocol between them.

Two kinds, both started through the sandbox (`sandbox.py`):

- a candidate process (`candidate.py`): one per candidate, the only place candidate Python runs.
  It imports CuTe DSL, says `ready`, takes one compile job, returns each N's host module as
  text, and exits. A pool keeps the next one started and warm, so its start-up is never
  charged to a candidate's deadline.
- a judge worker (this module's `_serve`): long-lived, runs only the judge's code. A CPU one
  seals host modules into audited object files (`runtime/seal.py`); the GPU one loads those objects
  (never candidate Python), verifies and profiles them, and keeps its CUDA context and the
  measured bandwidths warm between candidates.

The parent sends one JSON job per line on stdin; a process answers with JSON event lines on a
private copy of its stdout (fd 1 itself goes to the log, so whatever runs there cannot write
into the protocol): `ready` once started, `stage` when a stage starts, `progress` where it is
inside one (the shape and case being verified), `result` with its dataclass, `done` at the end. Each stage has its own deadline, counted from its `stage` event.
A process that dies, hangs, or reports a broken CUDA context is killed with everything it
started, and the candidate gets a `crashed` or `timeout` verdict naming the stage.
"""

from __future__ import annotations

import faulthandler
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmcompile.harness import gpu_turn
from llmcompile.harness.sandbox import CANDIDATE_LIMITS, GPU_LIMITS, Limits, PidsCgroup, Sandbox, apply_limits

# Seconds a stage may take before its process is killed. `start` covers a process's own start-up
# (imports, CUDA context) and is never charged to a candidate: a slow start is the judge's failure.
DEFAULT_TIMEOUTS = {
    "start": 180.0, "compile": 300.0, "seal": 120.0, "verify": 240.0, "profile": 420.0, "ping": 60.0, "warm": 120.0,
    "rest": 60.0,
}  # fmt: skip
# How a process that ended by a signal ended, in words a candidate's author can act on.
SIGNAL_WORDS = {
    signal.SIGXCPU: "it used up its CPU-time limit",
    signal.SIGXFSZ: "it wrote a file larger than the sandbox allows",
    signal.SIGSEGV: "segmentation fault",
    signal.SIGBUS: "bus error",
    signal.SIGABRT: "aborted",
    signal.SIGKILL: "killed (out of memory, or by the judge)",
}


_SPAWNER = ThreadPoolExecutor(1, thread_name_prefix="llmcompile-spawn")


class JudgeFailure(RuntimeError):
    """The judge's own process could not start or broke: never the candidate's fault."""


# `llmcompile run`'s exit status when the judge could not run (a JudgeFailure, or no sandbox): an
# eval records the problem apart from the model's failures and runs it again on a rerun
JUDGE_FAILED_RC = 4


@dataclass
class JobOutcome:
    results: dict[str, dict[str, Any]]  # stage -> the stage's dataclass as JSON
    failure: str | None = None  # "crashed" | "timeout" when the process did not finish
    stage: str | None = None  # the stage it was in when it failed
    detail: str = ""
    payload: dict[str, Any] = field(default_factory=dict)  # bulk data: host modules, objects
    at: dict[str, Any] = field(default_factory=dict)  # the last `progress` event: where it was


class Channel:
    """One sandboxed process that speaks the event protocol."""

    def __init__(
        self,
        module: str,
        sandbox: Sandbox,
        gpu: bool = False,
        limits: Limits = CANDIDATE_LIMITS,
        timeouts: dict[str, float] | None = None,
        env: dict[str, str] | None = None,
        turn: gpu_turn.Turn | None = None,
    ) -> None:
        self.module, self.sandbox, self.gpu, self.limits, self.env = module, sandbox, gpu, limits, env or {}
        # a GPU shared with other runs (gpu_turn.py): the process waits for `go` before touching it
        self.turn = turn
        if turn is not None:
            self.env = {**self.env, "LLMCOMPILE_WORKER_TURN": "1"}
        self.timeouts = {**DEFAULT_TIMEOUTS, **(timeouts or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.root = Path(tempfile.mkdtemp(prefix="llmcompile-worker-"))
        self.log = self.root / "worker.log"
        self.ready: dict[str, Any] | None = None
        self.spawned_at = 0.0  # time.time() when started; its `ready` event says when it was
        self.eof = False
        self.cgroup: PidsCgroup | None = None
        self._buf, self._went = b"", False

    # ------------------------------------------------------------------ lifetime

    def start(self) -> None:
        self.close()
        self._log_fh = open(self.log, "ab")  # noqa: SIM115 - lives as long as the process
        # bwrap's --die-with-parent follows the *thread* that started it: start every process from
        # one thread that lives as long as this module, not from a judge's short-lived pool threads
        self.spawned_at = time.time()
        self.proc = _SPAWNER.submit(self._popen).result()
        self._buf, self.ready, self._went = b"", None, False

    def _popen(self) -> subprocess.Popen[bytes]:
        return self.sandbox.popen(
            [sys.executable, "-m", self.module],
            gpu=self.gpu,
            limits=self.limits,
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log_fh,
            cwd=str(self.root),
        )

    def wait_ready(self) -> None:
        """Block until the process has started (its imports done), under the `start` deadline."""
        if self.proc is None:
            self.start()
        if self.ready is not None:
            return
        self._go()
        ev = self._read_event(time.monotonic() + self.timeouts["start"])
        if ev is None or ev.get("event") != "ready":
            code = self.proc.poll() if self.proc else None
            self.close()
            raise JudgeFailure(f"a judge process ({self.module}) did not start (exit {code}):\n{self.log_tail()}")
        self.ready = ev
        if self.sandbox.layers.pids_cgroup and self.proc is not None and self.cgroup is None:
            self.cgroup = PidsCgroup(self.sandbox.layers.pids_cgroup, self.limits.processes)
            self.cgroup.enter(self.proc.pid)

    def _go(self) -> None:
        """Wait for this run's turn on the GPU, then let the process start on it. The wait is not
        start-up: its deadline counts from here."""
        if self.turn is None or self._went:
            return
        if not self.turn.wait():
            raise JudgeFailure("the GPU worker's turn on its GPU was given up before it came")
        self._went = True
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(b"go\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # it died: reading its `ready` says so

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)  # the process group: whatever it started
                except ProcessLookupError:
                    pass
            self.proc.wait()
            self.proc = None
            self._log_fh.close()
        if self.cgroup is not None:
            self.cgroup.close()
            self.cgroup = None

    def dispose(self) -> None:
        """Close, and remove the log and scratch this process had on the host; the GPU's turn
        goes to the next run."""
        self.close()
        if self.turn is not None:
            self.turn.release()
        shutil.rmtree(self.root, ignore_errors=True)

    def log_tail(self, chars: int = 1500) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return re.sub(r"\x1b\[[0-9;]*m", "", text)[-chars:]

    # ------------------------------------------------------------------ protocol

    def _read_event(self, deadline: float) -> dict[str, Any] | None:
        """The next event line, or None when the process closed its end or the deadline passed
        (`self.eof` says which)."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        sel = selectors.DefaultSelector()
        sel.register(fd, selectors.EVENT_READ)
        self.eof = False
        try:
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(timeout=left):
                    return None
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    self.eof = True
                    return None
                self._buf += chunk
        finally:
            sel.close()
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def _ended(self, stage: str) -> JobOutcome:
        """The process stopped talking: it died (its end of the pipe closed) or ran out of time."""
        assert self.proc is not None
        timed_out = not self.eof
        if self.eof:  # bwrap outlives its child by a moment: wait for the exit status
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        else:  # ask for the Python stack of the stuck process, for the log
            try:
                self.proc.send_signal(signal.SIGUSR1)
                time.sleep(0.5)
            except ProcessLookupError:
                pass
        code = self.proc.poll()
        self.close()
        if timed_out:
            limit = self.timeouts.get(stage, 0)
            return JobOutcome({}, "timeout", stage, f"{stage} took longer than {limit:.0f} s\n" + self.log_tail(800))
        how = f"exit code {code}"
        # bwrap reports its child's death by signal S as exit code 128 + S
        sig = -code if code is not None and code < 0 else code - 128 if code is not None and 128 < code < 160 else None
        if sig in set(signal.Signals):
            how = f"{signal.Signals(sig).name}: {SIGNAL_WORDS.get(signal.Signals(sig), 'killed by a signal')}"
        return JobOutcome({}, "crashed", stage, f"the process died ({how})\n" + self.log_tail())

    def run(self, job: dict[str, Any]) -> JobOutcome:
        self.wait_ready()
        assert self.proc is not None and self.proc.stdin is not None
        results: dict[str, dict[str, Any]] = {}
        payload: dict[str, Any] = {}
        stage = job.get("kind", "job")
        try:
            self.proc.stdin.write((json.dumps(job) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            self.eof = True
            return self._ended(stage)
        deadline = time.monotonic() + self.timeouts.get(stage, 300.0)
        at: dict[str, Any] = {}
        while True:
            ev = self._read_event(deadline)
            if ev is None:
                out = self._ended(stage)
                out.results, out.at = results, at
                return out
            if ev["event"] == "progress":
                at = {k: v for k, v in ev.items() if k != "event"}
            elif ev["event"] == "stage":
                stage = ev["stage"]
                deadline = time.monotonic() + self.timeouts.get(stage, 300.0)
            elif ev["event"] == "result":
                results[ev["stage"]] = ev["data"]
            elif ev["event"] == "payload":
                payload.update(ev["data"])
            elif ev["event"] == "done":
                if ev.get("fatal"):
                    self.close()  # the CUDA context is gone; the next job gets a new process
                    return JobOutcome(results, "crashed", ev.get("stage"), ev.get("detail", ""), payload, at)
                # (a stage named on a sound end: the judge's own trouble, the process kept)
                return JobOutcome(results, None, ev.get("stage"), ev.get("detail", ""), payload, at)


class CandidatePool:
    """Fresh sandboxed processes for candidates, one each, started ahead of need: a candidate
    never shares a process with another (nor can it patch what judges the next one)."""

    def __init__(self, sandbox: Sandbox, warm: int = 1, timeouts: dict[str, float] | None = None) -> None:
        self.sandbox, self.warm, self.timeouts = sandbox, warm, timeouts
        self._idle: list[Channel] = []
        self._lock = threading.Lock()
        self._closed = False

    def _new(self) -> Channel:
        # one compute thread: a candidate needs no more, and threads count against its process limit
        ch = Channel("llmcompile.harness.candidate", self.sandbox, timeouts=self.timeouts, env={"OMP_NUM_THREADS": "1"})
        ch.start()
        return ch

    def prestart(self) -> None:
        """Start `warm` processes now, so the first candidates find them ready."""
        with self._lock:
            while not self._closed and len(self._idle) < self.warm:
                self._idle.append(self._new())

    def _take(self) -> Channel:
        with self._lock:
            ch = self._idle.pop(0) if self._idle else None
            if not self._closed and len(self._idle) < self.warm:
                self._idle.append(self._new())  # warms up while this one works
        return ch or self._new()

    def run(self, job: dict[str, Any]) -> JobOutcome:
        ch = self._take()
        try:
            return ch.run(job)
        finally:
            ch.dispose()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for ch in idle:
            ch.dispose()


def judge_worker(sandbox: Sandbox, gpu: bool, timeouts: dict[str, float] | None = None) -> Channel:
    """A long-lived judge process: `gpu=False` hides every GPU from it (sealing needs none)."""
    env = {} if gpu else {"CUDA_VISIBLE_DEVICES": ""}
    return Channel(
        "llmcompile.harness.worker",
        sandbox,
        gpu=gpu,
        limits=GPU_LIMITS if gpu else CANDIDATE_LIMITS,
        timeouts=timeouts,
        env={**env, "LLMCOMPILE_WORKER_GPU": "1" if gpu else "0"},
        turn=gpu_turn.from_env() if gpu else None,
    )


# --------------------------------------------------------------------------- process side


def protocol() -> Any:
    """Take fd 1 for the protocol and point the real fd 1 at the log (fd 2); returns `send`."""
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(**ev: Any) -> None:
        proto.write(json.dumps(ev) + "\n")
        proto.flush()

    return send


def _serve() -> None:
    apply_limits()
    send = protocol()
    gpu = os.environ.get("LLMCOMPILE_WORKER_GPU") == "1"
    import cutlass.cute  # noqa: F401 - start-up work, done before `ready`

    from llmcompile.runtime import artifact, seal

    facts: dict[str, Any] = {}
    if not gpu:  # a sealer: its first compile and seal cost seconds, paid here, before `ready`
        from llmcompile.harness import compiler

        for n, text in compiler.warm_up().items():
            seal.seal(text, n)
    else:
        import torch

        from llmcompile.bench.grid import versions

        before_the_gpu()
        if os.environ.get("LLMCOMPILE_WORKER_TURN") == "1":
            if not sys.stdin.readline():  # `go`: this run's turn on a GPU other runs share (gpu_turn.py)
                return  # the judge is gone
        torch.cuda.init()
        facts = {"gpu_total": torch.cuda.mem_get_info()[1], "gpu_name": torch.cuda.get_device_name()}
        facts["versions"] = versions()  # (what a cached baseline's timing is keyed by)
    send(event="ready", pid=os.getpid(), at=time.time(), **facts)
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        kind = job.get("kind")
        if kind == "ping":
            send(event="stage", stage="ping")
            facts = {"pid": os.getpid(), "uid": os.getuid(), "cwd": os.getcwd(), "env": sorted(os.environ)}
            # a candidate's module is named llmcompile_kernel_<hash> (contract.load_module)
            facts["candidate_modules"] = [m for m in sys.modules if m.startswith("llmcompile_kernel_")]
            facts["modules"] = len(sys.modules)
            send(event="result", stage="ping", data=facts)
            send(event="done")
            continue
        if kind == "warm":  # the device's bandwidth, measured while the first candidates compile
            from llmcompile.harness import gpu_stages
            from llmcompile.kernels import READ_PROBES, copy_probe

            send(event="stage", stage="warm")
            copy, read = gpu_stages.device_bandwidth(copy_probe, READ_PROBES)
            send(event="result", stage="warm", data={"copy_tbs": copy, "read_tbs": read})
            send(event="done")
            continue
        if kind == "rest":  # its run lends the GPU (gpu_turn.py): what the worker keeps there is freed
            import torch

            from llmcompile.harness.input_sets import forget_sets

            send(event="stage", stage="rest")
            torch.cuda.synchronize()
            forget_sets()
            send(event="result", stage="rest", data={"gpu_allocated": torch.cuda.memory_allocated()})
            send(event="done")
            continue
        try:
            fatal = (_seal if kind == "seal" else _gpu_job)(job, send, artifact)
        except Exception:  # noqa: BLE001 - a bug in the judge itself: say so, then go
            send(event="done", fatal=True, stage="harness", detail="harness error:\n" + traceback.format_exc()[-2000:])
            return
        if fatal:
            return


def before_the_gpu() -> None:
    """What the first jobs would import and compile, done before the GPU worker makes its CUDA
    context (where it waits for its turn on the GPU, off every run's path): loading a KernelBench
    file runs its model on torch's meta kernels, which import torch._dynamo (about 1 s); the
    bandwidth's probes (`warm`) are our kernels, compiled (0.2-0.7 s each on a CPU of ours)."""
    import torch._dynamo  # noqa: F401

    from llmcompile.bench.timing import compile_probes
    from llmcompile.harness import gpu_stages  # noqa: F401

    try:
        compile_probes()
    except Exception:  # noqa: BLE001 - a probe that cannot compile here compiles in `warm`, as before
        pass


def _seal(job: dict[str, Any], send, artifact) -> bool:
    """Host modules (text) -> audited object files, base64 in the payload."""
    import base64

    from llmcompile.runtime import seal

    send(event="stage", stage="seal")
    objects: dict[str, str] = {}
    launches: dict[str, Any] = {}
    try:
        for n, text in job["modules"].items():
            obj, launches[n] = seal.seal(text, int(n))
            objects[n] = base64.b64encode(obj).decode()
    except (artifact.ArtifactError, ValueError) as e:
        send(event="result", stage="seal", data={"ok": False, "error": str(e)})
        send(event="done")
        return False
    send(event="payload", data={"objects": objects, "launches": launches})
    send(event="result", stage="seal", data={"ok": True, "error": ""})
    send(event="done")
    return False


def _gpu_job(job: dict[str, Any], send, artifact) -> bool:
    """Load an artifact (objects only: no candidate Python), verify it, profile it.
    True when the process must exit afterwards (a broken CUDA context)."""
    import base64
    import hashlib
    from dataclasses import asdict

    from llmcompile.bench import timing
    from llmcompile.harness import gpu_stages, guards
    from llmcompile.specs import get_op
    from llmcompile.specs.kernelbench import load_problem

    t0 = time.perf_counter()
    if job.get("problem_source") is not None:  # a KernelBench file: the judge sent its text
        path = Path.cwd() / "problems" / hashlib.sha256(job["problem_source"].encode()).hexdigest()[:12] / job["op"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(job["problem_source"])
        spec = load_problem(path, independent_rows=job.get("independent_rows"))
    else:
        spec = get_op(job["op"])
    man = job["manifest"]
    d = Path.cwd() / "artifacts" / hashlib.sha256(json.dumps(man, sort_keys=True).encode()).hexdigest()[:16]
    objects = {name: base64.b64decode(b64) for name, b64 in job["objects"].items()}
    artifact.write(d, artifact.ArtifactManifest(**man), objects)
    stage = "load"
    try:
        _, fns = artifact.load_functions(d)
        # the problem (its first job in this process) and the kernel: before the timed stages
        send(event="result", stage="load", data={"seconds": time.perf_counter() - t0})
        stage = "verify"
        if "verify" in job["stages"]:
            send(event="stage", stage="verify")
            shapes = [tuple(s) for s in job["verify_shapes"]]
            read_only = job.get("read_only", True)
            v = gpu_stages.verify_candidate(
                fns, spec, job["dtype"], shapes, job["seeds"], read_only=read_only,
                progress=lambda m, n, case: send(event="progress", m=m, n=n, case=case),
            )  # fmt: skip
            send(event="result", stage="verify", data=asdict(v))
            if not v.ok:
                send(event="done")
                return False
        if "profile" in job["stages"]:
            stage = "profile"
            send(event="stage", stage="profile")
            from llmcompile.harness import memplan
            from llmcompile.kernels import READ_PROBES, copy_probe

            sol = gpu_stages.ceiling(spec, job["dtype"], copy_probe, READ_PROBES)
            shapes = [tuple(s) for s in job["profile_shapes"]]
            need = {
                (m, n): (
                    memplan.profile_bytes(spec, job["dtype"], m, n),
                    memplan.profile_bytes(spec, job["dtype"], m, n, least=True),
                )
                for m, n in shapes
            }
            known = {tuple(int(v) for v in k.split("x")): e for k, e in job.get("baseline_cache", {}).items()}
            again = lambda: gpu_stages.ceiling(spec, job["dtype"], copy_probe, READ_PROBES, fresh=True)  # noqa: E731
            p = gpu_stages.profile_candidate(
                fns, spec, job["dtype"], shapes, sol, job["baselines"], need, known, again,
                read_only=job.get("read_only", True),
                progress=lambda m, n, what: send(event="progress", m=m, n=n, case=what),
            )  # fmt: skip
            send(event="result", stage="profile", data=asdict(p))
    except gpu_stages.GpuShared as e:  # the GPU's trouble, not the candidate's; the process is sound
        send(event="done", stage="harness", detail=f"the judge cannot time honestly here: {e}, still after "
             f"{timing.CALM_S:.0f} s (another process on this GPU, or a host too busy to feed it): no verdict")  # fmt: skip
        return False
    except Exception as e:  # noqa: BLE001 - a fault on the GPU may have poisoned the context: restart
        if guards.device_fault(e):
            send(event="done", fatal=True, stage=stage, detail=f"{type(e).__name__}: {str(e)[:600]}")
        else:  # the judge's own bug (a check that cannot take this output): never the candidate's
            send(event="done", fatal=True, stage="harness", detail="harness error:\n" + traceback.format_exc()[-2000:])
        return True
    send(event="done")
    return False


if __name__ == "__main__":
    _serve()
