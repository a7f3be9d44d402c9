"""Run a suite on a Ray cluster: `llmcompile eval SUITE --backend ray [--address auto|local|ray://...]`.

Each problem is one Ray task asking for one GPU of the suite's target kind (Ray's own
`accelerator_type` label, so `--target h200` lands on H200s) or, with --compile-only, one
CPU. The task runs the same `llmcompile run` process the local pool runs, in a scratch
directory of its node, and returns its exit code, its output and its run directory packed;
the driver alone writes the eval directory (`EvalRunner.settle`), so a task that Ray runs
again after its node was lost (`RETRIES`) cannot leave a half-written problem or count one
twice. An interrupted eval resumes with the same command: finished problems are kept, the
rest start again. LLM requests of every task wait on one token bucket held by a Ray actor
(`llmcompile.agent.ratelimit`), so a cluster's workers share the endpoint's rate limit.

Every node needs this llmcompile installed (the same version as the driver) with the extra
`pip install 'llmcompile[ray]'`; without Ray, `--backend ray` says so and nothing else changes.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmcompile.agent import ratelimit
from llmcompile.suites.metrics import NOT_ATTEMPTED, PENDING
from llmcompile.suites.runner import EvalOptions, EvalRunner, problem_command
from llmcompile.suites.suite import Problem, Suite, SuiteError

INSTALL_HINT = "--backend ray needs Ray, an optional extra: pip install 'llmcompile[ray]'"
# Ray's accelerator_type label of each target's GPU (ray.util.accelerators)
ACCELERATOR = {"h100": "H100", "h200": "H200"}
NAMESPACE = "llmcompile"
RETRIES = 3  # runs of a task whose worker or node died, after the first
# Stand-ins in a task's command for what only its node knows
PYTHON, RUN_DIR, PROBLEM_FILE = "{python}", "{run_dir}", "{problem_file}"
DEFAULT_LLM_RATE = 120.0  # requests a minute across the cluster
FORWARDED_ENV = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "LLMCOMPILE_MODEL")


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise SuiteError(INSTALL_HINT) from None
    return ray


def placement(target: str, compile_only: bool) -> dict[str, Any]:
    """A problem's Ray task options: one GPU of the target's kind, or one CPU."""
    if compile_only:
        return {"num_cpus": 1, "num_gpus": 0}
    kind = ACCELERATOR.get(target)
    if kind is None:
        raise SuiteError(f"--backend ray knows no Ray accelerator label for target {target!r}")
    return {"num_cpus": 1, "num_gpus": 1, "accelerator_type": kind}


def check_cluster(resources: dict[str, float], target: str, compile_only: bool) -> None:
    """Refuse up front a suite no node can run (Ray would keep its tasks pending forever)."""
    if compile_only:
        return
    placement(target, compile_only)  # (a target without a Ray label is refused there)
    label = f"accelerator_type:{ACCELERATOR[target]}"
    if not resources.get("GPU") or not resources.get(label):
        kinds = sorted(k.split(":", 1)[1] for k in resources if k.startswith("accelerator_type:"))
        raise SuiteError(
            f"no node of the Ray cluster has a {ACCELERATOR[target]} GPU (target {target}); "
            f"GPU kinds there: {', '.join(kinds) or 'none'}. Run with --target of one of them, or --compile-only"
        )


def pack(path: Path) -> bytes | None:
    if not path.is_dir():
        return None
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(path, arcname=".")
    return buf.getvalue()


def unpack(data: bytes, dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(dest, filter="data")


def run_task(pid: str, cmd: list[str], state: bytes | None, problem: tuple[str, bytes] | None, env: dict) -> dict:
    """A problem on a worker node: its agent process in a scratch directory, given back packed."""
    import ray

    work = Path(tempfile.mkdtemp(prefix=f"llmcompile-{pid}-"))
    try:
        run_dir = work / "run"
        if state is not None:
            unpack(state, run_dir)
        prob = None
        if problem is not None:
            prob = work / problem[0]
            prob.write_bytes(problem[1])
        where = {PYTHON: sys.executable, RUN_DIR: str(run_dir), PROBLEM_FILE: str(prob)}
        t0 = time.perf_counter()
        proc = subprocess.run(
            [where.get(c, c) for c in cmd],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},  # (Ray set CUDA_VISIBLE_DEVICES to this task's GPU)
            cwd=work,
        )
        return {
            "rc": proc.returncode,
            "log": proc.stdout,
            "run_dir": pack(run_dir),
            "wall": time.perf_counter() - t0,
            "node": ray.get_runtime_context().get_node_id(),
            "gpu": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def start_rate_limiter(ray: Any, per_minute: float) -> tuple[dict[str, str], Any]:
    """One token bucket for the eval, in an actor; the environment that leads tasks to it, and
    the actor's handle (the actor lives while the handle does: keep it for the eval's length)."""
    name = f"llm-rate-{uuid.uuid4().hex[:12]}"
    actor = ray.remote(num_cpus=0)(ratelimit.TokenBucket)
    handle = actor.options(name=name, namespace=NAMESPACE).remote(per_minute / 60.0, max(1.0, per_minute / 60.0))
    ray.get(handle.__ray_ready__.remote())  # up and registered before any task looks it up
    env = {ratelimit.ENV_ACTOR: f"{NAMESPACE}/{name}", "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    return env, handle


class RayEvalRunner(EvalRunner):
    """`EvalRunner` with Ray tasks in place of the local pool; the eval directory as before."""

    def __init__(
        self,
        suite: Suite,
        opts: EvalOptions,
        out: Path,
        address: str = "auto",
        llm_rate: float = DEFAULT_LLM_RATE,
        command: Callable[[Problem, Suite, EvalOptions, Path], list[str]] = problem_command,
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(suite, opts, out)
        self.address, self.llm_rate, self.command = address, llm_rate, command
        # what the agent processes need from the driver's environment (the endpoint and its key:
        # a worker node's own environment has neither), and anything given
        self.env = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ} | (env or {})

    def task_command(self, p: Problem) -> tuple[list[str], bytes | None, tuple[str, bytes] | None]:
        """The problem's command with this host's paths replaced by stand-ins, the state of an
        interrupted run to resume from, and a problem file's text."""
        run_dir = self.pdir / p.id
        cmd = self.command(p, self.suite, self.opts, run_dir)
        resume = "--resume" in cmd
        sub = {sys.executable: PYTHON, str(run_dir): RUN_DIR}
        problem = None
        if p.custom and Path(p.op).is_file():
            sub[p.op] = PROBLEM_FILE
            problem = (Path(p.op).name, Path(p.op).read_bytes())
        return [sub.get(c, c) for c in cmd], pack(run_dir) if resume else None, problem

    def absorb(self, p: Problem, res: dict, cmd: list[str]) -> str:
        """A finished task's output and run directory into the eval directory, then its outcome."""
        device = f"{res['node'][:12]}:gpu{res['gpu']}" if res.get("gpu") else res["node"][:12]
        with open(self.pdir / f"{p.id}.log", "ab") as fh:
            fh.write(f"\n$ {' '.join(cmd)}   (ray node {device})\n".encode() + res["log"])
        if res["run_dir"] is not None:
            unpack(res["run_dir"], self.pdir / p.id)
        return self.settle(p, res["rc"], res["wall"], device)

    def run(self, progress: Callable[[str, str, str], None] = lambda slot, pid, line: None) -> int:
        ray = import_ray()
        self.start()
        todo = self.todo()
        if not todo:  # every problem has its outcome: only the report is left
            return 0
        if not ray.is_initialized():
            # "local": a one-node cluster of this host's CPUs and GPUs, started here for this eval
            local = self.address == "local"
            # (a cluster of our own needs no dashboard: starting one costs seconds and its web client)
            extra = {"include_dashboard": False} if local else {}
            ray.init(address=None if local else self.address, namespace=NAMESPACE, log_to_driver=False, **extra)
        resources = ray.cluster_resources()
        check_cluster(resources, self.suite.target, self.opts.compile_only)
        env, limiter = dict(self.env), None
        # agents on a node share its cores (one agent a GPU; compile-only, one a core, as Ray places
        # them): each judge sizes its compile processes to its share
        gpus = resources.get("GPU", 0.0)
        per_task = 1.0 if self.opts.compile_only or not gpus else resources.get("CPU", 2.0) / gpus
        env.setdefault("LLMCOMPILE_CPUS", str(max(1, int(per_task))))
        if self.opts.resolved_llm() == "openai":
            shared, limiter = start_rate_limiter(ray, self.llm_rate)
            env |= shared
        task = ray.remote(run_task).options(
            max_retries=RETRIES, retry_exceptions=False, **placement(self.suite.target, self.opts.compile_only)
        )
        pending: dict[Any, tuple[Problem, list[str]]] = {}
        for p in todo:
            if self.skip_offline(p):
                progress("ray", p.id, f"= {NOT_ATTEMPTED}")
                continue
            cmd, state, problem = self.task_command(p)
            pending[task.remote(p.id, cmd, state, problem, env)] = (p, cmd)
            progress("ray", p.id, "submitted")
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
                for ref in ready:
                    p, cmd = pending.pop(ref)
                    try:
                        res = ray.get(ref)
                    except ray.exceptions.RayError as e:
                        # lost past its retries: no outcome, so the next run of the eval tries again
                        progress("ray", p.id, f"= {PENDING} (Ray gave up: {type(e).__name__}; rerun to retry)")
                        continue
                    progress("ray", p.id, f"= {self.absorb(p, res, cmd)}")
        except KeyboardInterrupt:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
        del limiter  # (held until every task has finished)
        return len(self.todo())
