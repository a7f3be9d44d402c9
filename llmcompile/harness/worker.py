"""Worker processes: where candidate code is imported, compiled and run, never in the caller.

The parent sends one JSON job per line on the worker's stdin; the worker answers with JSON
event lines on a private copy of its stdout (fd 1 itself is pointed at stderr, so whatever a
candidate prints cannot corrupt the protocol): `stage` when a stage starts, `result` with
its dataclass, `done` at the end. The parent gives each stage a deadline; a worker that
dies, hangs, or reports that the candidate broke the CUDA context is killed and replaced,
and the candidate gets a `crashed` or `timeout` verdict. Workers stay warm between jobs:
CUDA context, the measured bandwidths and the compile caches are kept.
"""

from __future__ import annotations

import faulthandler
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SECRET_ENV = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL|^OPENAI_|^ANTHROPIC_|^HF_", re.I)
# Seconds a stage may take before the worker is killed. Compile is per N; verify/profile are
# bounded by the grid and by the timing loop, which never needs minutes on an H100.
DEFAULT_TIMEOUTS = {"start": 120.0, "compile": 300.0, "verify": 240.0, "profile": 420.0, "ping": 60.0}


def worker_env(cuda_visible: str | None = None) -> dict[str, str]:
    """The caller's environment without credentials: a candidate never sees an API key."""
    env = {k: v for k, v in os.environ.items() if not SECRET_ENV.search(k)}
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("CUTE_DSL_ARCH", "sm_90a")
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if cuda_visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible
    return env


@dataclass
class Job:
    source: str
    op: str  # a built-in op name or a KernelBench file path (OpSpec.ref)
    dtype: str
    stages: list[str]  # of compile, verify, profile (static runs in the caller)
    ns: list[int]
    verify_shapes: list[tuple[int, int]] = field(default_factory=list)
    profile_shapes: list[tuple[int, int]] = field(default_factory=list)
    baselines: list[str] = field(default_factory=list)
    seeds: int = 2
    kind: str = "candidate"  # or "ping"


@dataclass
class JobOutcome:
    results: dict[str, dict[str, Any]]  # stage -> the stage's dataclass as JSON
    failure: str | None = None  # "crashed" | "timeout" when the worker did not finish
    stage: str | None = None  # the stage it was in when it failed
    detail: str = ""


class Worker:
    def __init__(self, cuda_visible: str | None = None, timeouts: dict[str, float] | None = None) -> None:
        self.cuda_visible = cuda_visible
        self.timeouts = {**DEFAULT_TIMEOUTS, **(timeouts or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.root = Path(tempfile.mkdtemp(prefix="llmcompile-worker-"))
        self.log = self.root / "worker.log"
        self.jobs_done = 0

    def start(self) -> None:
        self.close()
        self._log_fh = open(self.log, "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llmcompile.harness.worker", str(self.root)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log_fh,
            env=worker_env(self.cuda_visible),
            cwd=self.root,
        )
        self._buf = b""

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.proc = None
            self._log_fh.close()

    def log_tail(self, chars: int = 1500) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return re.sub(r"\x1b\[[0-9;]*m", "", text)[-chars:]

    def _read_event(self, deadline: float) -> dict[str, Any] | None:
        """The next event line, or None when the worker died or the deadline passed."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        sel = selectors.DefaultSelector()
        sel.register(fd, selectors.EVENT_READ)
        try:
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(timeout=left):
                    return None
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return None
                self._buf += chunk
        finally:
            sel.close()
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def run(self, job: Job) -> JobOutcome:
        if not self.alive:
            self.start()
        assert self.proc is not None and self.proc.stdin is not None
        self.jobs_done += 1
        results: dict[str, dict[str, Any]] = {}
        stage = "start"
        try:
            self.proc.stdin.write((json.dumps(asdict(job)) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            self.close()
            return JobOutcome(results, "crashed", stage, "worker died before the job started\n" + self.log_tail())
        deadline = time.monotonic() + self.timeouts["start"]
        while True:
            ev = self._read_event(deadline)
            if ev is None:
                timed_out = self.alive
                code = self.proc.poll() if self.proc else None
                if timed_out:  # ask for the Python stack of the stuck worker, for the log
                    self.proc.send_signal(signal.SIGUSR1)
                    time.sleep(1.0)
                self.close()
                if timed_out:
                    return JobOutcome(
                        results,
                        "timeout",
                        stage,
                        f"{stage} took longer than {self.timeouts.get(stage, 0):.0f} s\n" + self.log_tail(800),
                    )
                return JobOutcome(
                    results, "crashed", stage, f"the worker process died (exit code {code})\n" + self.log_tail()
                )
            if ev["event"] == "stage":
                stage = ev["stage"]
                deadline = time.monotonic() + self.timeouts.get(stage, 300.0)
            elif ev["event"] == "result":
                results[ev["stage"]] = ev["data"]
            elif ev["event"] == "done":
                if ev.get("fatal"):
                    self.close()  # the CUDA context is gone; the next job gets a new worker
                    return JobOutcome(results, "crashed", ev.get("stage"), ev.get("detail", ""))
                return JobOutcome(results)


# --------------------------------------------------------------------------- worker side


def _serve(root: Path) -> None:
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # a candidate's prints go to the log, not into the protocol
    sys.stdout = sys.stderr

    def send(**ev: Any) -> None:
        proto.write(json.dumps(ev) + "\n")
        proto.flush()

    for line in sys.stdin:
        if not line.strip():
            continue
        job = Job(**json.loads(line))
        if job.kind == "ping":
            send(event="stage", stage="ping")
            send(event="result", stage="ping", data={"pid": os.getpid(), "cwd": os.getcwd(), "env": sorted(os.environ)})
            send(event="done")
            continue
        try:
            fatal = _run_job(job, root, send)
        except Exception:  # noqa: BLE001 - a bug in the judge itself: say so, stay alive
            send(event="done", fatal=True, stage="harness", detail="harness error:\n" + traceback.format_exc()[-2000:])
            return
        if fatal:
            return


def _run_job(job: Job, root: Path, send) -> bool:
    """Run the job's stages; True when the worker must exit afterwards."""
    import hashlib

    from llmcompile.harness import compiler
    from llmcompile.ops import get_op

    spec = get_op(job.op)
    work = root / hashlib.sha256(job.source.encode()).hexdigest()[:16]
    work.mkdir(parents=True, exist_ok=True)
    os.chdir(work)
    send(event="stage", stage="compile")
    result, fns = compiler.compile_candidate(job.source, spec, job.dtype, job.ns, work)
    send(event="result", stage="compile", data=asdict(result))
    if not result.ok or not ({"verify", "profile"} & set(job.stages)):
        send(event="done")
        return False

    from llmcompile.harness import gpu_stages

    stage = "verify"
    try:
        if "verify" in job.stages:
            send(event="stage", stage="verify")
            v = gpu_stages.verify_candidate(fns, spec, job.dtype, [tuple(s) for s in job.verify_shapes], job.seeds)
            send(event="result", stage="verify", data=asdict(v))
            if not v.ok:
                send(event="done")
                return False
        if "profile" in job.stages:
            stage = "profile"
            send(event="stage", stage="profile")
            from llmcompile.kernels import READ_PROBES, copy_probe

            sol = gpu_stages.device_bandwidth(copy_probe, READ_PROBES)
            p = gpu_stages.profile_candidate(
                fns, spec, job.dtype, [tuple(s) for s in job.profile_shapes], sol, job.baselines
            )
            send(event="result", stage="profile", data=asdict(p))
    except Exception as e:  # noqa: BLE001 - a fault on the GPU may have poisoned the context: restart
        send(event="done", fatal=True, stage=stage, detail=f"{type(e).__name__}: {str(e)[:600]}")
        return True
    send(event="done")
    return False


if __name__ == "__main__":
    _serve(Path(sys.argv[1]))
