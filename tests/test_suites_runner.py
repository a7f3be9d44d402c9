"""CPU (CI): a small suite end to end, compile-only, through `llmcompile eval` with a scripted
OpenAI-compatible server on loopback. The agent runs in its own processes (two at once) and
reaches the server through the real `openai` client.

softmax-bf16   answered with an honest kernel: compiles
swiglu-bf16    (a KernelBench file) answered with a kernel that never compiles
rmsnorm-fp32   answered with prose and no code: rejected before compiling
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from llmcompile.cli import main
from tests.bad_kernels import BASE
from tests.llm_server import ScriptedServer

ROOT = Path(__file__).resolve().parents[1]
NEVER_COMPILES = BASE.replace("    inv = 1.0 / s\n", "    inv = 1.0 / s * scale\n")

SUITE = f"""
name = "tiny"
baselines = ["eager", "compile"]
[budget]
rounds = 2
samples = 1
[[problem]]
op = "softmax"
dtypes = ["bf16"]
shapes = ["64x1024"]
[[problem]]
file = "{ROOT / "evals/problems/swiglu.py"}"
[[problem]]
op = "rmsnorm"
dtypes = ["fp32"]
shapes = ["64x1024"]
"""


def _respond(body: dict) -> tuple[int, dict, str]:
    task = body["messages"][1]["content"]
    if "SwiGLU" in task:
        return 200, {}, f"```python\n{NEVER_COMPILES}```"
    if "rms_norm" in task or "rmsnorm" in task.split("\n", 3)[0].lower():
        return 200, {}, "I would use a two-pass reduction, but I cannot write it now."
    return 200, {}, f"```python\n{BASE}```"


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    s = ScriptedServer(_respond)
    yield s
    s.close()


def test_small_suite_compile_only(tmp_path: Path, server: ScriptedServer, capsys) -> None:
    suite = tmp_path / "tiny.toml"
    suite.write_text(SUITE)
    out = tmp_path / "eval"
    argv = ["eval", str(suite), "--llm", "openai", "--model", "m", "--base-url", server.url,
            "--compile-only", "--jobs", "2", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    res = json.loads((out / "results.json").read_text())
    probs = {p["id"]: p for p in res["problems"]}
    assert set(probs) == {"softmax-bf16", "swiglu-bf16", "rmsnorm-fp32"}
    assert probs["softmax-bf16"]["compiled"] == [True, True] and probs["softmax-bf16"]["best_status"] == "compiled"
    assert probs["swiglu-bf16"]["statuses"] == ["compile_error", "compile_error"]
    assert probs["rmsnorm-fp32"]["statuses"] == ["static_rejected", "static_rejected"]
    assert all(p["state"] == "done" and p["llm_used"] for p in probs.values())
    a = res["aggregate"]
    assert res["ks"] == [1, 2] and a["compile_at"] == {"1": pytest.approx(1 / 3), "2": pytest.approx(1 / 3)}
    assert a["correct_at"] is None and a["fast_p"] is None  # compile-only: not measured, not zero
    assert a["usage"]["requests"] == 6 and a["usage"]["tokens"] == 6 * 110
    assert len(server.requests) == 6
    for f in ("report.md", "sol.png", "speedup.png", "eval.json"):
        assert (out / f).stat().st_size > 0
    for pid in probs:  # every per-problem run directory is kept, with its transcript
        assert (out / "problems" / pid / "transcript.jsonl").is_file()
    md = (out / "report.md").read_text()
    assert "| compile@1 | 33% |" in md and "not measured (compile-only)" in md

    # a rerun resumes: finished problems are neither asked nor judged again
    assert main(argv) == 0
    assert len(server.requests) == 6

    # an interrupted problem (its outcome not yet written) resumes from its own state
    (out / "problems" / "softmax-bf16.json").unlink()
    (out / "problems" / "softmax-bf16" / "summary.json").unlink()
    assert main(argv) == 0
    assert len(server.requests) == 6
    assert json.loads((out / "problems" / "softmax-bf16" / "summary.json").read_text())["best"]["id"] == "c00_00"
    assert "--resume" in (out / "problems" / "softmax-bf16.log").read_text()

    # the same directory with other options, or for another target, is refused, not mixed
    assert main([*argv[:-2], "--samples", "3", "--out", str(out)]) == 2
    assert "another suite or with other options" in capsys.readouterr().err
    assert main([*argv[:-2], "--target", "h200", "--out", str(out)]) == 2
    assert "another suite or with other options" in capsys.readouterr().err
    o = json.loads((out / "problems" / "swiglu-bf16.json").read_text())
    assert o["gpu"] is None and o["started"] <= o["t"]  # compile-only: no GPU slot

    capsys.readouterr()
    assert main(["eval", "compare", str(out), str(out)]) == 0
    cmp = capsys.readouterr().out
    assert "| compile@1 | 33% | 33% |" in cmp and "| swiglu-bf16 |" in cmp


def test_eval_usage_errors(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert main(["eval", str(tmp_path / "none.toml")]) == 2
    assert "no such suite file" in capsys.readouterr().err
    assert main(["eval", "compare", str(tmp_path)]) == 2
    assert "two eval directories" in capsys.readouterr().err
    assert main(["eval", "compare", str(tmp_path), str(tmp_path)]) == 2
    assert "no results.json" in capsys.readouterr().err
    suite = tmp_path / "s.toml"
    suite.write_text('[[problem]]\nop = "softmax"\n')
    assert main(["eval", str(suite), "--llm", "openai"]) == 2
    assert "needs --model" in capsys.readouterr().err
    import torch

    if not torch.cuda.is_available():
        assert main(["eval", str(suite), "--out", str(tmp_path / "e")]) == 2
        assert "no CUDA GPU is visible" in capsys.readouterr().err


def test_eval_for_another_target(tmp_path: Path, server: ScriptedServer) -> None:
    """--target runs a suite for another GPU than the one it names: every agent is told."""
    suite = tmp_path / "one.toml"
    suite.write_text('[[problem]]\nop = "rmsnorm"\ndtypes = ["fp32"]\nshapes = ["64x1024"]\n[budget]\nrounds = 1\n'
                     'samples = 1\n')  # fmt: skip
    out = tmp_path / "eval"
    argv = ["eval", str(suite), "--llm", "openai", "--model", "m", "--base-url", server.url, "--compile-only"]
    assert main([*argv, "--target", "h999", "--out", str(out)]) == 2
    assert main([*argv, "--target", "h200", "--out", str(out)]) == 0
    assert "--target h200" in (out / "problems" / "rmsnorm-fp32.log").read_text()
    assert json.loads((out / "eval.json").read_text())["suite"]["target"] == "h200"
    assert (out / "report.md").read_text().startswith("# Eval: one on h200")


def test_a_finished_eval_reports_again_without_a_gpu(tmp_path: Path, monkeypatch, capsys) -> None:
    from llmcompile.suites import runner as R
    from llmcompile.suites.suite import load_suite

    suite_file = tmp_path / "tiny.toml"
    suite_file.write_text(SUITE)
    out = tmp_path / "eval"
    runner = R.EvalRunner(load_suite(suite_file), R.EvalOptions(llm="offline"), out)
    runner.start()
    for p in runner.suite.problems:  # every outcome written, as a GPU run that finished leaves them
        (out / "problems" / f"{p.id}.json").write_text(json.dumps({"state": "not_attempted", "reason": "r"}))
    monkeypatch.setattr(R, "gpu_slots", lambda gpus: [])
    assert main(["eval", str(suite_file), "--llm", "offline", "--out", str(out)]) == 0
    assert "| states | not_attempted 3 |" in (out / "report.md").read_text()
    (out / "problems" / "softmax-bf16.json").unlink()  # one left to run: that needs the GPU
    assert main(["eval", str(suite_file), "--llm", "offline", "--out", str(out)]) == 2
    assert "no CUDA GPU is visible" in capsys.readouterr().err


def test_an_eval_on_another_gpu_than_its_target_stops_before_writing_anything(tmp_path: Path, monkeypatch, capsys):
    """On H200s an eval for the H100 had run every problem's agent, each refused the GPU, and all
    49 were recorded failed (outcomes a rerun keeps): the eval now says so once, first."""
    from llmcompile.suites import runner as R

    suite_file = tmp_path / "tiny.toml"
    suite_file.write_text(SUITE)
    out = tmp_path / "eval"
    monkeypatch.setattr(R, "gpu_slots", lambda gpus: ["3", "1"])
    names = {"3": "NVIDIA H100 80GB HBM3", "1": "NVIDIA H200"}
    monkeypatch.setattr(R, "gpu_names", lambda slots: [names[s] for s in slots])
    assert main(["eval", str(suite_file), "--llm", "offline", "--gpus", "all", "--out", str(out)]) == 2
    assert "target h100 asked for, but GPU 1 is 'NVIDIA H200': pass --target h200" in capsys.readouterr().err
    assert not out.exists()  # no eval.json, no outcome: the same --out takes the right command
    R.check_gpus("h100", ["3"])
    names["3"] = "Some Other GPU"
    with pytest.raises(R.SuiteError, match="no target is this GPU"):
        R.check_gpus("h200", ["3"])


def test_the_gpu_names_come_from_a_process_given_those_gpus() -> None:
    """The host's GPU 0 named by a child given it; with no GPU none is named, and the eval
    refuses rather than guess."""
    import torch

    from llmcompile.suites import runner as R

    names = R.gpu_names(["0"])
    if torch.cuda.is_available():
        assert len(names) == 1 and names[0].strip()
    else:
        assert names == []
        with pytest.raises(R.SuiteError, match="a process given them sees 0"):
            R.check_gpus("h100", ["0"])


def test_a_problem_whose_judge_failed_is_kept_apart_and_run_again(tmp_path: Path) -> None:
    """The judge's own failure (the agent's exit 4) is not the model's: the problem is recorded
    judge_failed, its run directory set aside (kept where the agent saved a state to resume), and a
    rerun of the eval runs it again, where a failed one stays failed."""
    from llmcompile.suites import metrics
    from llmcompile.suites import runner as R
    from llmcompile.suites.suite import load_suite

    suite_file = tmp_path / "tiny.toml"
    suite_file.write_text(SUITE)
    runner = R.EvalRunner(load_suite(suite_file), R.EvalOptions(llm="offline"), tmp_path / "eval")
    runner.start()
    first, second, third = runner.suite.problems
    for p in (first, second, third):
        (runner.pdir / p.id).mkdir()
        (runner.pdir / f"{p.id}.log").write_text("llmcompile: the judge could not run: harness error: ValueError\n")
    for name in ("state.json", "config.json"):  # (what the agent saves after a round)
        (runner.pdir / second.id / name).write_text("{}")
    assert runner.settle(first, R.JUDGE_FAILED_RC, 1.0, "0") == metrics.JUDGE_FAILED
    assert runner.settle(second, R.JUDGE_FAILED_RC, 1.0, "0") == metrics.JUDGE_FAILED
    assert runner.settle(third, 2, 1.0, "0") == metrics.FAILED
    assert not (runner.pdir / first.id).exists() and (runner.pdir / f"{first.id}.judge-failed-1").is_dir()
    assert (runner.pdir / second.id / "state.json").is_file()  # (the rerun resumes it)
    assert "judge could not run" in runner.outcome(first)["reason"]
    assert runner.todo() == [first, second]
    assert metrics.aggregate(runner.records(), [1], [])["states"][metrics.JUDGE_FAILED] == 2
    assert R.problem_command(second, runner.suite, runner.opts, runner.pdir / second.id)[4] == "--resume"


def test_a_problem_recorded_done_without_its_run_directory_is_run_again(tmp_path: Path, monkeypatch, capsys) -> None:
    """An eval resumed after its run directories were deleted (or moved) had reported those problems
    done with no candidate, every share of them zero: they are run again, and the eval says so."""
    from llmcompile import doctor
    from llmcompile.suites import runner as R
    from llmcompile.suites.suite import load_suite

    suite_file = tmp_path / "tiny.toml"
    suite_file.write_text(SUITE)
    out = tmp_path / "eval"
    runner = R.EvalRunner(load_suite(suite_file), R.EvalOptions(llm="offline"), out)
    runner.start()
    first, second, third = runner.suite.problems
    for p in (first, second):
        (runner.pdir / f"{p.id}.json").write_text(json.dumps({"state": "done", "reason": "", "rc": 0}))
    (runner.pdir / f"{third.id}.json").write_text(json.dumps({"state": "not_attempted", "reason": "r"}))
    (runner.pdir / first.id).mkdir()
    (runner.pdir / first.id / "summary.json").write_text("{}")
    assert runner.todo() == [second] and runner.gone() == [second.id]
    monkeypatch.setattr(R, "gpu_slots", lambda gpus: [])  # (the rerun needs a GPU: the eval stops there)
    monkeypatch.setattr(doctor, "uncompiled", lambda: [doctor.Uncompiled("torch", "/x/torch", 9, 10)])
    assert main(["eval", str(suite_file), "--llm", "offline", "--out", str(out)]) == 2
    err = " ".join(capsys.readouterr().err.split())  # (rich wraps its lines)
    assert f"1 problem(s) recorded done have no run directory left, run again: {second.id}" in err
    assert "note: no cached bytecode for torch (9 of 10 modules)" in err


def test_gpu_slots_name_the_hosts_devices_under_cuda_visible_devices(monkeypatch):
    """An eval started under CUDA_VISIBLE_DEVICES=1 runs its agents on the host's GPU 1: a child's
    CUDA_VISIBLE_DEVICES=0 would be the host's GPU 0, a GPU the user did not give the eval."""
    import torch

    from llmcompile.suites import runner as R

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert R.gpu_slots("all") == ["3", "1"]
    assert R.gpu_slots("1") == ["3"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert R.gpu_slots("all") == ["0", "1"]
    with pytest.raises(R.SuiteError):
        R.gpu_slots("3")


def test_two_agents_share_each_gpu_and_take_it_in_turn(tmp_path: Path, monkeypatch) -> None:
    """The next problem starts up beside the one judging on its GPU (never more than --per-gpu on
    one), each given the GPU's lock file, a MIG id made a file name, and half its GPU's cores."""
    from llmcompile.harness import gpu_turn
    from llmcompile.suites import metrics
    from llmcompile.suites import runner as R
    from llmcompile.suites.suite import load_suite

    suite_file = tmp_path / "tiny.toml"
    suite_file.write_text(
        'name = "six"\n'
        + "".join(
            f'[[problem]]\nop = "{op}"\ndtypes = ["bf16", "fp32"]\n' for op in ("softmax", "rmsnorm", "layernorm")
        )
    )
    runner = R.EvalRunner(load_suite(suite_file), R.EvalOptions(llm="offline", per_gpu=2), tmp_path / "eval")
    monkeypatch.setattr(R, "gpu_slots", lambda gpus: ["0", "MIG-4a/1/0"])
    monkeypatch.setattr(R, "check_gpus", lambda target, slots: None)
    monkeypatch.setattr(R, "host_cpus", lambda: 16)
    monkeypatch.delenv("LLMCOMPILE_CPUS", raising=False)
    at_once: dict[str, int] = {}
    most: dict[str, int] = {}
    envs: dict[str, dict[str, str]] = {}
    lock = threading.Lock()

    def run_one(p, device, show):
        with lock:
            at_once[device] = at_once.get(device, 0) + 1
            most[device] = max(most.get(device, 0), at_once[device])
            envs[p.id] = runner.agent_env(device)
        time.sleep(0.3)
        with lock:
            at_once[device] -= 1
        runner._finish(p, metrics.NOT_ATTEMPTED, "", 0, 0.3, device)
        return metrics.NOT_ATTEMPTED

    monkeypatch.setattr(runner, "run_one", run_one)
    assert len(runner.suite.problems) == 6 and runner.run() == 0
    assert most == {"0": 2, "MIG-4a/1/0": 2}
    for env in envs.values():
        want = "0.lock" if env["CUDA_VISIBLE_DEVICES"] == "0" else "MIG-4a_1_0.lock"
        assert env[gpu_turn.ENV] == str(tmp_path / "eval" / "gpu-turns" / want)
        assert env["LLMCOMPILE_CPUS"] == "4"  # 16 cores, four agents at once
    assert (tmp_path / "eval" / "gpu-turns").is_dir()
    # compile-only: no GPU, no lock
    assert gpu_turn.ENV not in R.EvalRunner(runner.suite, R.EvalOptions(compile_only=True), tmp_path / "c").agent_env(
        None
    )
