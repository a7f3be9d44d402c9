"""CPU (CI): `llmcompile eval --backend ray` on a local Ray instance with fake GPU resources
(two "H100s"): scheduling by GPU kind, a worker killed mid-problem, the driver as the only
writer of the eval directory, resume, the shared LLM rate limit, and a real compile-only
problem giving the local pool's outcome. Without Ray installed, only the install hint is tested."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from llmcompile.agent import ratelimit
from llmcompile.suites.metrics import DONE
from llmcompile.suites.runner import EvalOptions, EvalRunner
from llmcompile.suites.suite import Budget, Problem, Suite, SuiteError, load_suite

ROOT = Path(__file__).resolve().parents[1]


def test_without_ray_the_backend_says_how_to_install_it(monkeypatch) -> None:
    from llmcompile.suites import ray_backend

    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    with pytest.raises(SuiteError, match=r"pip install 'llmcompile\[ray\]'"):
        ray_backend.import_ray()


def test_token_bucket_spaces_requests_at_its_rate() -> None:
    now = [0.0]
    bucket = ratelimit.TokenBucket(rate=2.0, burst=2.0, clock=lambda: now[0])
    assert [bucket.reserve() for _ in range(4)] == [0.0, 0.0, 0.5, 1.0]  # a burst of 2, then 0.5 s apart
    now[0] = 10.0  # idle long enough to refill the burst, not more
    assert [bucket.reserve() for _ in range(3)] == [0.0, 0.0, 0.5]
    with pytest.raises(ValueError):
        ratelimit.TokenBucket(rate=0)


def test_without_an_actor_requests_do_not_wait(monkeypatch) -> None:
    monkeypatch.delenv(ratelimit.ENV_ACTOR, raising=False)
    assert ratelimit.wait_turn() == 0.0


def test_placement_asks_for_the_targets_gpu_kind_or_a_cpu() -> None:
    from llmcompile.suites.ray_backend import check_cluster, placement

    assert placement("h200", False) == {"num_cpus": 1, "num_gpus": 1, "accelerator_type": "H200"}
    assert placement("h100", True) == {"num_cpus": 1, "num_gpus": 0}
    with pytest.raises(SuiteError, match="no node of the Ray cluster has a H200"):
        check_cluster({"CPU": 2.0, "GPU": 2.0, "accelerator_type:H100": 2.0}, "h200", False)
    check_cluster({"CPU": 2.0}, "h200", True)  # compile-only needs no GPU
    with pytest.raises(SuiteError, match="no Ray accelerator label for target 'a100'"):
        check_cluster({"CPU": 2.0, "GPU": 1.0}, "a100", False)


# --------------------------------------------------------------------------- on a local Ray instance

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def cluster():
    ray.init(
        num_cpus=2, num_gpus=2, resources={"accelerator_type:H100": 2}, include_dashboard=False,
        namespace="llmcompile", log_to_driver=False,
    )  # fmt: skip
    yield
    ray.shutdown()


# What a problem's agent process does here instead of the agent: writes a run directory with a
# summary, says where it ran and on which GPU, and (first time, with KILL_ONCE set) kills the
# Ray worker running it, as a lost node would.
FAKE_AGENT = r"""
import json, os, signal, sys
run_dir = sys.argv[1]
marker = os.environ.get("KILL_ONCE")
if marker and not os.path.exists(marker):
    open(marker, "w").write(str(os.getppid()))
    os.kill(os.getppid(), signal.SIGKILL)
    sys.exit(1)
os.makedirs(run_dir, exist_ok=True)
with open(os.path.join(run_dir, "attempts"), "a") as fh:
    fh.write("x")
json.dump({"cwd": os.getcwd(), "gpu": os.environ.get("CUDA_VISIBLE_DEVICES")}, open(os.path.join(run_dir, "where.json"), "w"))
json.dump({"best_sol_pct": 50.0}, open(os.path.join(run_dir, "summary.json"), "w"))
print("fake agent done on", os.environ.get("CUDA_VISIBLE_DEVICES"))
"""


def fake_command(p: Problem, suite: Suite, opts: EvalOptions, run_dir: Path) -> list[str]:
    return [sys.executable, "-c", FAKE_AGENT, str(run_dir)]


def _suite(target: str = "h100", n: int = 2) -> Suite:
    problems = tuple(Problem(f"p{i}-bf16", "softmax", "bfloat16", Budget()) for i in range(n))
    return Suite("tiny", "", target, (), problems)


def _runner(tmp_path: Path, suite: Suite, env: dict | None = None) -> object:
    from llmcompile.suites.ray_backend import RayEvalRunner

    return RayEvalRunner(suite, EvalOptions(llm="offline"), tmp_path / "eval", command=fake_command, env=env)


def test_problems_run_on_gpus_of_the_target_kind_and_only_the_driver_writes(cluster, tmp_path: Path) -> None:
    runner = _runner(tmp_path, _suite())
    seen: list[tuple[str, str]] = []
    assert runner.run(lambda slot, pid, line: seen.append((pid, line))) == 0
    out = tmp_path / "eval"
    for p in runner.suite.problems:
        outcome = json.loads((out / "problems" / f"{p.id}.json").read_text())
        assert outcome["state"] == DONE and ":gpu" in outcome["gpu"]
        where = json.loads((out / "problems" / p.id / "where.json").read_text())
        # the agent ran in its node's scratch directory on the GPU Ray gave it; the eval
        # directory got its run directory from the driver
        assert not where["cwd"].startswith(str(out)) and where["gpu"] in ("0", "1")
        assert "fake agent done" in (out / "problems" / f"{p.id}.log").read_text()
    assert [line for _, line in seen].count("= done") == 2


def test_a_suite_for_a_gpu_kind_the_cluster_lacks_is_refused(cluster, tmp_path: Path) -> None:
    with pytest.raises(SuiteError, match="no node of the Ray cluster has a H200"):
        _runner(tmp_path, _suite("h200")).run()


def test_a_killed_worker_reruns_its_problem_once_and_nothing_counts_twice(cluster, tmp_path: Path) -> None:
    marker = tmp_path / "killed"
    runner = _runner(tmp_path, _suite(n=1), env={"KILL_ONCE": str(marker)})
    assert runner.run() == 0
    assert marker.is_file()  # the first worker was killed
    p = runner.suite.problems[0]
    out = tmp_path / "eval" / "problems"
    assert json.loads((out / f"{p.id}.json").read_text())["state"] == DONE
    assert (out / p.id / "attempts").read_text() == "x"  # the finished attempt alone reached the eval directory
    assert len(list(out.glob("*.json"))) == 1


def test_an_interrupted_eval_resumes_without_rerunning_finished_problems(cluster, tmp_path: Path) -> None:
    suite = _suite(n=2)
    assert _runner(tmp_path, suite).run() == 0
    pdir = tmp_path / "eval" / "problems"
    (pdir / f"{suite.problems[1].id}.json").unlink()  # as if the eval stopped while it ran
    done_before = (pdir / f"{suite.problems[0].id}.json").read_text()
    again = _runner(tmp_path, suite)
    assert [p.id for p in again.todo()] == [suite.problems[1].id]
    assert again.run() == 0
    assert (pdir / f"{suite.problems[0].id}.json").read_text() == done_before
    assert json.loads((pdir / f"{suite.problems[1].id}.json").read_text())["state"] == DONE


def test_the_llm_rate_limit_is_shared_by_every_task(cluster) -> None:
    from llmcompile.suites.ray_backend import start_rate_limiter

    env, _limiter = start_rate_limiter(ray, per_minute=600.0)  # 10 a second, bursts of 10

    @ray.remote(num_cpus=1)
    def requests(env: dict, k: int) -> list[float]:
        os.environ.update(env)
        stamps = []
        for _ in range(k):
            ratelimit.wait_turn()
            stamps.append(time.time())
        return stamps

    stamps = sorted(sum(ray.get([requests.remote(env, 15), requests.remote(env, 15)]), []))
    # 30 requests at 10 a second after a burst of 10
    assert stamps[-1] - stamps[0] >= 1.9, stamps


def test_agents_on_ray_ask_a_real_endpoint_through_the_shared_limit(cluster, tmp_path: Path, monkeypatch) -> None:
    """The scripted-server suite of test_suites_runner, through `llmcompile eval --backend ray`:
    the same outcomes, the key reaching the tasks from the driver, and the agents' requests
    (three problems in two tasks at once) spaced by the one limit of 60 a minute."""
    from llmcompile.cli import main
    from tests.llm_server import ScriptedServer
    from tests.test_suites_runner import SUITE, _respond

    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    server = ScriptedServer(_respond)
    try:
        suite = tmp_path / "tiny.toml"
        suite.write_text(SUITE)
        out = tmp_path / "eval"
        argv = ["eval", str(suite), "--llm", "openai", "--model", "m", "--base-url", server.url,
                "--compile-only", "--backend", "ray", "--llm-rate", "60", "--out", str(out)]  # fmt: skip
        assert main(argv) == 0
    finally:
        server.close()
    res = json.loads((out / "results.json").read_text())
    probs = {p["id"]: p for p in res["problems"]}
    assert probs["softmax-bf16"]["compiled"] == [True, True]
    assert probs["swiglu-bf16"]["statuses"] == ["compile_error", "compile_error"]
    assert probs["rmsnorm-fp32"]["statuses"] == ["static_rejected", "static_rejected"]
    assert all(p["state"] == "done" and p["llm_used"] for p in probs.values())
    times = sorted(server.times)
    assert len(times) == 6 and times[-1] - times[0] >= 4.0, [round(t - times[0], 2) for t in times]


def test_a_real_compile_only_problem_ends_as_on_the_local_pool(cluster, tmp_path: Path) -> None:
    """`llmcompile run` itself in a Ray task (offline default, compile-only): the same outcome
    and the same kind of run directory as the local pool gives it."""
    from llmcompile.suites.ray_backend import RayEvalRunner

    suite_file = tmp_path / "one.toml"
    suite_file.write_text(
        'name = "one"\n[budget]\nrounds = 1\nsamples = 1\n[[problem]]\nop = "softmax"\ndtypes = ["bf16"]\n'
        'shapes = ["64x1024"]\n'
    )
    suite = load_suite(suite_file)
    opts = EvalOptions(llm="offline", compile_only=True, unsafe_no_sandbox=True)
    local = EvalRunner(suite, opts, tmp_path / "local")
    assert local.run() == 0
    remote = RayEvalRunner(suite, opts, tmp_path / "ray")
    assert remote.run() == 0
    pid = suite.problems[0].id
    for d in ("local", "ray"):
        assert json.loads((tmp_path / d / "problems" / f"{pid}.json").read_text())["state"] == DONE
    local_summary = json.loads((tmp_path / "local" / "problems" / pid / "summary.json").read_text())
    ray_summary = json.loads((tmp_path / "ray" / "problems" / pid / "summary.json").read_text())
    assert set(local_summary) == set(ray_summary)
