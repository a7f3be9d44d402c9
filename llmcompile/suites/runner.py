"""Run a suite: the agent on every problem, one `llmcompile run` process per problem, each seeing
one GPU through CUDA_VISIBLE_DEVICES. Two run on each GPU at once (`--per-gpu`): the next starts
up (imports, the problem loaded, its first candidates compiled) while the last one judges, and
they take the GPU in turn (`harness/gpu_turn.py`), so no two verify or time on it at once.

The eval directory:
    eval.json              the suite and options it was started with (a rerun must match)
    problems/<id>/         the agent's run directory for that problem (kept whole)
    problems/<id>.log      the agent process's output
    problems/<id>.json     how the problem ended: done, not_attempted, failed or judge_failed, and why
    problems/<id>.judge-failed-<n>/   a run directory the judge failed in, set aside for the rerun
    gpu-turns/<device>.lock   the lock each GPU's runs take in turn
    results.json, report.md, sol.png, speedup.png   (llmcompile.suites.report)

A rerun with the same --out skips finished problems and resumes interrupted ones
(`llmcompile run --resume`), so an interrupted eval loses nothing; a problem whose judge failed
(the agent's exit 4: our failure, not the candidate's) runs again too.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from llmcompile.agent.providers import choose_llm
from llmcompile.agent.runs import write_json_atomic
from llmcompile.harness import gpu_turn
from llmcompile.harness.cpus import host_cpus
from llmcompile.harness.worker import JUDGE_FAILED_RC
from llmcompile.suites.metrics import DONE, FAILED, JUDGE_FAILED, NOT_ATTEMPTED, PENDING, ProblemRecord, collect
from llmcompile.suites.suite import Problem, Suite, SuiteError


@dataclass
class EvalOptions:
    llm: str = "auto"  # auto | openai | offline
    model: str = ""
    base_url: str = ""
    samples: int | None = None  # overrides the suite's budget
    rounds: int | None = None
    compile_only: bool = False
    gpus: str = "all"  # all | a count
    per_gpu: int = 2  # agents at once on each GPU (one judging, the next starting up: gpu_turn.py)
    jobs: int = 1  # problems at once in compile-only runs (no GPU)
    unsafe_no_sandbox: bool = False

    def resolved_llm(self) -> str:
        return choose_llm(self.llm, self.model)


def gpu_slots(gpus: str) -> list[str]:
    """CUDA device ids to run on (the host's names for them)."""
    import torch

    count = torch.cuda.device_count()
    if gpus == "all":
        n = count
    else:
        try:
            n = int(gpus)
        except ValueError:
            raise SuiteError(f"--gpus takes 'all' or a count, not {gpus!r}") from None
        if n > count:
            raise SuiteError(f"--gpus {n}: only {count} CUDA GPU(s) visible")
    # a child's CUDA_VISIBLE_DEVICES names a device as the host does, not as this process sees
    # it: under CUDA_VISIBLE_DEVICES=1, our device 0 is the host's 1
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return (visible if len(visible) >= n else [str(i) for i in range(count)])[:n]


def gpu_names(slots: list[str]) -> list[str]:
    """The names of the GPUs `slots` (the host's ids, as gpu_slots gives them), as the agents will
    see them, asked in a child process: the eval's own process holds no CUDA context on them."""
    code = "import torch; print(*(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())), sep='\\n')"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(slots)}
    try:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise SuiteError(f"asking GPUs {', '.join(slots)} their names took over 120 s: is the driver well?") from None
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def check_gpus(target: str, slots: list[str]) -> None:
    """Refuse an eval whose GPUs are not its target, before anything is written: each problem's
    agent would refuse the GPU alone, and the eval would have recorded every problem as failed,
    outcomes a rerun keeps."""
    from llmcompile.specs.targets import TARGETS, get_target, target_for

    want = get_target(target)
    names = gpu_names(slots)
    if len(names) != len(slots):
        raise SuiteError(f"GPUs {', '.join(slots)} asked for; a process given them sees {len(names)}")
    for slot, gpu in zip(slots, names):
        if not want.is_gpu(gpu):
            other = target_for(gpu)
            fix = (
                f"pass --target {other.name}"
                if other
                else f"no target is this GPU (known: {', '.join(sorted(TARGETS))})"
            )
            raise SuiteError(f"target {want.name} asked for, but GPU {slot} is {gpu!r}: {fix}")


def problem_command(p: Problem, suite: Suite, opts: EvalOptions, run_dir: Path) -> list[str]:
    cmd = [sys.executable, "-m", "llmcompile", "run"]
    if (run_dir / "state.json").is_file() and (run_dir / "config.json").is_file():
        return cmd + ["--resume", str(run_dir)] + (["--unsafe-no-sandbox"] if opts.unsafe_no_sandbox else [])
    b = p.budget
    cmd += [
        p.op, "--target", suite.target, "--dtype", p.dtype, "--llm", opts.resolved_llm(),
        "--samples", str(opts.samples or b.samples), "--rounds", str(opts.rounds or b.rounds),
        "--max-tokens", str(b.max_tokens), "--time", str(b.time_s), "--target-sol", str(b.target_sol),
        "--baselines", ",".join(suite.baselines) or "none", "--out", str(run_dir),
    ]  # fmt: skip
    if opts.model:
        cmd += ["--model", opts.model]
    if opts.base_url:
        cmd += ["--base-url", opts.base_url]
    if opts.compile_only:
        cmd.append("--compile-only")
    if opts.unsafe_no_sandbox:
        cmd.append("--unsafe-no-sandbox")
    if p.shapes:
        cmd += ["--shapes", ",".join(f"{m}x{n}" for m, n in p.shapes)]
    return cmd


def _last_line(path: Path) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, path.stat().st_size - 2048))
            lines = [ln for ln in fh.read().decode(errors="replace").splitlines() if ln.strip()]
        return lines[-1].strip() if lines else ""
    except OSError:
        return ""


def _error_of(log: Path) -> str:
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()] if log.is_file() else []
    errs = [ln for ln in lines if "error" in ln.lower()]
    return (errs or lines or ["(no output)"])[-1].strip()[:500]


class EvalRunner:
    def __init__(self, suite: Suite, opts: EvalOptions, out: Path) -> None:
        self.suite, self.opts, self.out = suite, opts, out
        self.pdir = out / "problems"
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._stop = threading.Event()
        self._slots = 1  # agents at once (set by run)

    # ---------------------------------------------------------------- bookkeeping

    def start(self) -> None:
        """Write eval.json, or check that an existing one describes the same eval."""
        self.pdir.mkdir(parents=True, exist_ok=True)
        head = {
            "suite": asdict(self.suite),
            "options": {**asdict(self.opts), "llm": self.opts.resolved_llm()},
        }
        path = self.out / "eval.json"
        if path.is_file():
            old = json.loads(path.read_text())
            same = [p["id"] for p in old["suite"]["problems"]] == [p.id for p in self.suite.problems]
            same = (
                same
                and old["suite"].get("target") == self.suite.target
                and {k: old["options"].get(k) for k in ("llm", "model", "samples", "rounds", "compile_only")}
                == {k: head["options"][k] for k in ("llm", "model", "samples", "rounds", "compile_only")}
            )
            if not same:
                raise SuiteError(
                    f"{self.out} holds an eval of another suite or with other options; give a new --out "
                    "(or the same suite and options to resume it)"
                )
            return
        from llmcompile.bench.grid import versions

        path.write_text(json.dumps({**head, "started": time.strftime("%Y-%m-%d %H:%M:%S"), **versions()}, indent=1))

    def outcome(self, p: Problem) -> dict[str, Any] | None:
        f = self.pdir / f"{p.id}.json"
        return json.loads(f.read_text()) if f.is_file() else None

    def record(self, p: Problem) -> ProblemRecord:
        rec = ProblemRecord(p.id, p.op, p.dtype)
        o = self.outcome(p)
        if o:
            rec.state, rec.reason, rec.gpu = o["state"], o.get("reason", ""), o.get("gpu")
            rec.process_s = o.get("wall_s", 0.0)
        run_dir = self.pdir / p.id
        return collect(rec, run_dir) if run_dir.is_dir() else rec

    def records(self) -> list[ProblemRecord]:
        return [self.record(p) for p in self.suite.problems]

    def _finish(
        self, p: Problem, state: str, reason: str, rc: int | None, wall: float, device: str | None = None
    ) -> None:
        # which GPU (CUDA_VISIBLE_DEVICES) and when: enough to see problems share a host's GPUs
        now = time.time()
        data = {
            "state": state,
            "reason": reason,
            "rc": rc,
            "wall_s": wall,
            "t": now,
            "started": now - wall,
            "gpu": device,
        }
        write_json_atomic(self.pdir / f"{p.id}.json", data)

    # ---------------------------------------------------------------- running

    def todo(self) -> list[Problem]:
        """The problems without an outcome, those whose judge failed, and those recorded done whose
        run directory is gone (`gone`): each is run again."""
        return [
            p
            for p in self.suite.problems
            if (o := self.outcome(p)) is None or o["state"] == JUDGE_FAILED or self._gone(p, o)
        ]

    def _finished(self, p: Problem) -> bool:
        """The agent's run directory holds its summary: what a done problem's report is read from."""
        return (self.pdir / p.id / "summary.json").is_file()

    def _gone(self, p: Problem, o: dict[str, Any]) -> bool:
        # its verdicts live in the run directory: without it the report would count it with no candidate
        return o["state"] == DONE and not self._finished(p)

    def gone(self) -> list[str]:
        """The problems recorded done whose run directory (deleted or moved) no longer says how."""
        return [p.id for p in self.suite.problems if (o := self.outcome(p)) is not None and self._gone(p, o)]

    def agent_env(self, device: str | None) -> dict[str, str]:
        """An agent process's environment: its GPU, the lock it takes its turn on that GPU with,
        and its share of the host's cores."""
        env = dict(os.environ)
        if device is not None:
            env["CUDA_VISIBLE_DEVICES"] = device
            turns = self.out / "gpu-turns"
            turns.mkdir(parents=True, exist_ok=True)
            env[gpu_turn.ENV] = str(turns / (re.sub(r"[^\w.-]", "_", device) + ".lock"))  # (a MIG id has slashes)
        # agents at once share the host's cores: each judge sizes its compile processes to its share
        env.setdefault("LLMCOMPILE_CPUS", str(max(1, host_cpus() // max(1, self._slots))))
        return env

    def run_one(self, p: Problem, device: str | None, show: Callable[[str], None]) -> str:
        if self.skip_offline(p):
            return NOT_ATTEMPTED
        run_dir = self.pdir / p.id
        log = self.pdir / f"{p.id}.log"
        env = self.agent_env(device)
        cmd = problem_command(p, self.suite, self.opts, run_dir)
        t0 = time.perf_counter()
        with open(log, "ab") as fh:
            fh.write(f"\n$ {' '.join(cmd)}\n".encode())
            fh.flush()
            proc = subprocess.Popen(
                cmd,
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # a terminal Ctrl-C reaches only us; we forward it once
            )
            self._procs[p.id] = proc
            while proc.poll() is None:
                show(_last_line(log))
                time.sleep(0.5)
        self._procs.pop(p.id, None)
        if self._stop.is_set():
            return PENDING
        return self.settle(p, proc.returncode, time.perf_counter() - t0, device)

    def skip_offline(self, p: Problem) -> bool:
        """A custom problem the offline default has no template for: recorded as not attempted."""
        if p.custom and self.opts.resolved_llm() == "offline":
            reason = _no_template(p.op)
            if reason:
                self._finish(p, NOT_ATTEMPTED, reason, None, 0.0)
                return True
        return False

    def settle(self, p: Problem, rc: int, wall: float, device: str | None) -> str:
        """The problem's outcome from its agent process's exit and run directory."""
        if rc == 130:
            return PENDING  # interrupted: no outcome, so a rerun resumes it
        if rc in (0, 1) and self._finished(p):
            self._finish(p, DONE, "", rc, wall, device)
            return DONE
        if rc == JUDGE_FAILED_RC:
            run_dir = self.pdir / p.id
            if run_dir.is_dir() and not (run_dir / "state.json").is_file():  # (a rerun starts afresh)
                n = 1 + sum(1 for _ in self.pdir.glob(f"{p.id}.judge-failed-*"))
                run_dir.rename(self.pdir / f"{p.id}.judge-failed-{n}")
            self._finish(p, JUDGE_FAILED, _error_of(self.pdir / f"{p.id}.log"), rc, wall, device)
            return JUDGE_FAILED
        self._finish(p, FAILED, _error_of(self.pdir / f"{p.id}.log"), rc, wall, device)
        return FAILED

    def run(self, progress: Callable[[str, str, str], None] = lambda slot, pid, line: None) -> int:
        """Run every problem without an outcome; returns how many are still pending."""
        todo = self.todo()  # (start() writes or checks eval.json only: no outcome changes)
        if not todo:  # every problem has its outcome: only the report is left, which needs no GPU
            self.start()
            return 0
        if self.opts.compile_only:
            slots: list[str | None] = [None] * max(1, self.opts.jobs)
        else:
            devices = gpu_slots(self.opts.gpus)
            if not devices:
                raise SuiteError("no CUDA GPU is visible: run the eval with --compile-only, or on the target GPU")
            check_gpus(self.suite.target, devices)
            slots = [d for d in devices for _ in range(max(1, self.opts.per_gpu))]
        self.start()
        work: queue.Queue[Problem] = queue.Queue()
        for p in todo:
            work.put(p)
        self._slots = len(slots)

        def worker(i: int, device: str | None) -> None:
            name = (
                f"job{i}"
                if device is None
                else f"gpu{device}" + (f".{i % self.opts.per_gpu}" if self.opts.per_gpu > 1 else "")
            )
            while not self._stop.is_set():
                try:
                    p = work.get_nowait()
                except queue.Empty:
                    break
                progress(name, p.id, "starting")
                state = self.run_one(p, device, lambda line, pid=p.id: progress(name, pid, line))
                progress(name, p.id, f"= {state}")
            progress(name, "", "idle")

        threads = [threading.Thread(target=worker, args=(i, d), daemon=True) for i, d in enumerate(slots)]
        for t in threads:
            t.start()
        try:
            while any(t.is_alive() for t in threads):
                for t in threads:
                    t.join(timeout=0.5)
        except KeyboardInterrupt:
            self.interrupt()
            for t in threads:
                t.join(timeout=120)
            raise
        return len(self.todo())

    def interrupt(self) -> None:
        """Ctrl-C: each agent process saves its state and stops; a rerun resumes them."""
        self._stop.set()
        for proc in list(self._procs.values()):
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        deadline = time.time() + 90
        for proc in list(self._procs.values()):
            try:
                proc.wait(timeout=max(1.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                proc.kill()


def _no_template(op: str) -> str:
    """Why the offline default cannot attempt the custom op `op` ("" when a template matches)."""
    from llmcompile.agent import patterns
    from llmcompile.specs import OpError, get_op

    try:
        m = patterns.match(get_op(op))
    except OpError as e:
        return str(e)
    return f"custom op and no LLM: {m.reason}" if isinstance(m, patterns.NoMatch) else ""
