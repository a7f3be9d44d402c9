"""CPU (CI): the agent loop against a scripted OpenAI-compatible server on loopback, driven
through the real `openai` client; then replay of the recorded run.

Without a GPU the verify and profile stages cannot run, so a wrapper gives the verdicts of
those two stages from a marker in each scripted kernel (`# SCRIPT: wrong|slow|fast`); the
static check and compile are the real judge's. On the H100, tests/test_agent_gpu.py runs
the offline agent with the real judge end to end.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmcompile.agent.loop import run_agent
from llmcompile.agent.providers import OpenAIProvider, ProviderError, ReplayProvider, Slot
from llmcompile.agent.runs import RunConfig, RunStore
from llmcompile.harness import Judge, JudgeOptions
from llmcompile.harness.verdict import CheckFailure, ProfileResult, ShapeTiming, VerifyResult
from llmcompile.specs import get_op
from tests.bad_kernels import BASE
from tests.llm_server import ScriptedServer


def _answer(code: str, note: str) -> str:
    return f"{note}\n\n```python\n{code}```\n"


NOT_COMPILING = BASE.replace("    inv = 1.0 / s\n", "    inv = 1.0 / s * scale\n")
ANSWERS = [
    _answer(NOT_COMPILING, "first try"),
    _answer(BASE + "# SCRIPT: wrong\n", "fixed the name"),
    _answer(BASE + "# SCRIPT: slow\n", "fixed the indexing"),
    _answer(BASE + "# SCRIPT: fast\n", "vectorised"),
]


class ScriptedGPUJudge:
    """The real judge for static + compile; verify/profile verdicts from the source's marker."""

    def __init__(self) -> None:
        self.real = Judge(gpu=False, compile_workers=1)
        self.calls = 0
        self.gpu = []  # "lend" / "want" / "judge", in order (a shared GPU lent while an LLM answers)

    def evaluate_many(self, sources, spec, dtype, opts):
        self.calls += len(sources)
        self.gpu.append("judge")
        cpu = JudgeOptions(stages=("static", "compile"), profile_shapes=[(64, 1024)], verify_ns=[1024])
        verdicts = self.real.evaluate_many(sources, spec, dtype, cpu)
        for v, src in zip(verdicts, sources):
            if v.status != "compiled":
                continue
            if "# SCRIPT: wrong" in src:
                f = CheckFailure(
                    "mismatch", 3, 1024, "random", 0, "3 of 3072 elements of `out` are wrong; first at [1, 7]"
                )
                v.verify, v.status, v.message = VerifyResult(False, 4, [(3, 1024)], f), "wrong", "verification failed"
            else:
                pct = 95.0 if "# SCRIPT: fast" in src else 40.0
                v.verify = VerifyResult(True, 30, [(3, 1024)])
                v.profile = ProfileResult(True, 3.0, 3.1, [ShapeTiming(64, 1024, 0.01, 3 * pct / 100, pct, True)])
                v.status, v.message = "profiled", f"{pct}% of SOL"
        return verdicts

    def lend_gpu(self) -> None:
        self.gpu.append("lend")

    def want_gpu(self) -> None:
        self.gpu.append("want")

    def close(self) -> None:
        self.real.close()


@pytest.fixture(scope="module")
def judge():
    j = ScriptedGPUJudge()
    yield j
    j.close()


def _cfg(provider: str) -> RunConfig:
    return RunConfig("softmax", "bfloat16", "h100", provider, "test-model", samples=1, rounds=6, baselines=[])


def test_loop_converges_through_openai_client(tmp_path: Path, judge, monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    script = [
        (429, {"Retry-After": "0"}, "slow down"),
        (200, {}, ANSWERS[0]),
        (500, {}, "oops"),
        (200, {}, ANSWERS[1]),
        (200, {}, ANSWERS[2]),
        (200, {}, ANSWERS[3]),
    ]
    server = ScriptedServer(script)
    judge.gpu.clear()
    try:
        provider = OpenAIProvider("test-model", server.url, attempts=3)
        store = RunStore(tmp_path / "run")
        result = run_agent(get_op("softmax"), _cfg("openai"), provider, judge, store)
    finally:
        server.close()
    assert not server.script  # the 429 and the 500 were retried, every answer consumed
    assert len(server.requests) == 6
    msgs = [r["messages"] for r in server.requests if r["messages"]]
    # each error reached the next prompt of the conversation
    assert "name 'scale' is not defined" in msgs[3][-1]["content"]
    assert "wrong results" in msgs[4][-1]["content"] and "[mismatch]" in msgs[4][-1]["content"]
    assert "40.0 |" in msgs[5][-1]["content"] and "Best so far" in msgs[5][-1]["content"]
    # and what the compile saw: registers, shared memory and how many CTAs fit an SM
    assert "B shared memory" in msgs[5][-1]["content"] and "CTAs per SM" in msgs[5][-1]["content"]
    assert result.best is not None and result.best.id == "c03_00" and result.best.min_pct == 95.0
    assert result.stop_reason.startswith("best reached")
    assert result.usage.requests == 4 and result.usage.total == 4 * 110
    statuses = [
        json.loads(p.read_text())["verdict"]["status"] for p in sorted((tmp_path / "run/candidates").glob("*.json"))
    ]
    assert statuses == ["compile_error", "wrong", "profiled", "profiled"]
    kinds = [json.loads(line)["kind"] for line in (tmp_path / "run/transcript.jsonl").read_text().splitlines()]
    assert kinds.count("answer") == 4 and kinds.count("feedback") == 4 and kinds[:2] == ["prompt", "prompt"]

    # while each answer was awaited, the GPU was lent (other runs on it may judge), then wanted back
    assert judge.gpu == ["lend", "want", "judge"] * 4

    # replay: the same answers without any network, the same verdicts and the same best
    calls = judge.calls
    judge.gpu.clear()
    replayed = run_agent(
        get_op("softmax"), _cfg("replay"), ReplayProvider(tmp_path / "run"), judge, RunStore(tmp_path / "replay")
    )
    assert replayed.best is not None and replayed.best.id == "c03_00"
    assert replayed.verdicts == result.verdicts and judge.calls == calls + 4
    assert judge.gpu == ["judge"] * 4  # (no LLM waited on: the GPU is never lent)


def test_resume_reuses_answers_and_verdicts(tmp_path: Path, judge) -> None:
    first = RunStore(tmp_path / "a")
    src_run = tmp_path / "rec"
    rec = RunStore(src_run)
    for i, text in enumerate(ANSWERS):
        rec.transcript(kind="answer", round=i, sample=0, text=text, usage={}, meta={})
    cfg = _cfg("replay")
    cfg.rounds = 2
    run_agent(get_op("softmax"), cfg, ReplayProvider(src_run), judge, first)
    calls = judge.calls
    cfg.rounds = 6  # "resume" with more budget: rounds 0-1 are neither asked nor judged again
    res = run_agent(get_op("softmax"), cfg, ReplayProvider(src_run), judge, RunStore(tmp_path / "a"))
    assert judge.calls == calls + 2 and res.best is not None and res.best.id == "c03_00"


def test_missing_key_and_dead_endpoint_are_clear(monkeypatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ProviderError, match="OPENAI_API_KEY"):
        OpenAIProvider("m")
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    dead = OpenAIProvider("m", "http://127.0.0.1:9/v1", attempts=2, timeout=2)
    with pytest.raises(ProviderError, match="cannot reach"):
        dead.propose([[{"role": "user", "content": "hi"}]], [Slot(0, 0)])


def test_unknown_model_is_clear(monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    server = ScriptedServer([(404, {}, "The model `nope` does not exist")])
    try:
        with pytest.raises(ProviderError, match="not found"):
            OpenAIProvider("nope", server.url).propose([[{"role": "user", "content": "x"}]], [Slot(0, 0)])
    finally:
        server.close()


def test_replay_without_transcript_is_clear(tmp_path: Path) -> None:
    with pytest.raises(ProviderError, match="no transcript"):
        ReplayProvider(tmp_path)


class _RecordingJudge:
    """Records the options each candidate is judged with (the scripted judge gives verdicts)."""

    def __init__(self, inner: ScriptedGPUJudge) -> None:
        self.inner, self.baselines = inner, []

    def evaluate_many(self, sources, spec, dtype, opts):
        self.baselines.append(list(opts.baselines))
        return self.inner.evaluate_many(sources, spec, dtype, opts)


@pytest.mark.parametrize("rounds", [1, 2])
def test_a_single_candidate_budget_times_the_baselines_in_its_own_profile(tmp_path: Path, judge, rounds) -> None:
    """With one candidate in the budget its profile is the final word, so it carries the
    baselines (the report then need not profile it again); with more, candidates are timed alone."""
    rec = RunStore(tmp_path / "rec")
    for i in range(2):
        rec.transcript(kind="answer", round=i, sample=0, text=ANSWERS[3], usage={}, meta={})
    cfg = _cfg("replay")
    cfg.rounds, cfg.baselines = rounds, ["eager"]
    rj = _RecordingJudge(judge)
    run_agent(get_op("softmax"), cfg, ReplayProvider(tmp_path / "rec"), rj, RunStore(tmp_path / "run"))
    assert rj.baselines and all(b == (["eager"] if rounds == 1 else []) for b in rj.baselines)
