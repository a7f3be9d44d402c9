"""harness/early.py: the GPU worker started before the agent's imports, taken by the judge or closed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from llmcompile.harness import early
from llmcompile.harness.judge import Judge
from llmcompile.harness.sandbox import ROOT, Layers, Sandbox
from llmcompile.harness.worker import Channel

# answers `ready`, then every job (the judge's "warm") with a sound end
FAKE_GPU_WORKER = """
import json, sys, time
print(json.dumps({"event": "ready", "pid": 0, "at": time.time()}), flush=True)
for line in sys.stdin:
    print(json.dumps({"event": "result", "stage": "warm", "data": {}}), flush=True)
    print(json.dumps({"event": "done"}), flush=True)
"""


@pytest.fixture
def started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A fake GPU worker as `early.start` leaves it (unsandboxed: the test's own process)."""
    (tmp_path / "fake_gpu_worker.py").write_text(FAKE_GPU_WORKER)
    box = Sandbox(Layers(), unsafe=True)
    ch = Channel("fake_gpu_worker", box, env={"PYTHONPATH": f"{tmp_path}:{ROOT}"})
    ch.start()
    monkeypatch.setattr(early, "_started", {False: (box, ch)})
    monkeypatch.setenv("LLMCOMPILE_CPUS", "2")  # (one sealer, one candidate process)
    yield ch
    ch.dispose()


def test_no_gpu_worker_is_started_where_no_gpu_is_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(early, "_started", {})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert not early.gpu_visible() and early.start() is False and early._started == {}


def test_the_judge_takes_the_worker_started_early(started: Channel) -> None:
    pid = started.proc.pid
    with Judge(gpu=True, compile_workers=1) as j:
        assert j.gpu_worker is started and started.proc.pid == pid  # taken, not started again
        assert j.sandbox is started.sandbox  # (its sealers and candidates run in the same)
        deadline = time.time() + 60
        while "gpu_warmed" not in j.start_facts() and time.time() < deadline:
            time.sleep(0.05)
        f = j.start_facts()
        assert f["gpu_spawned"] == started.spawned_at and f["gpu_spawned"] <= f["gpu_ready"] <= f["gpu_warmed"]
    assert early._started == {} and not started.alive  # closed with the judge


def test_a_judge_that_cannot_use_it_closes_it(started: Channel) -> None:
    """A compile-only judge (a resumed compile-only run), or one with its own sandbox or deadlines:
    the early worker is not theirs, and is not left holding a CUDA context."""
    with Judge(gpu=False, compile_workers=1) as j:
        assert j.gpu_worker is None
    assert early._started == {} and not started.alive


def test_a_worker_started_for_the_other_sandbox_setting_is_not_taken(started: Channel) -> None:
    assert early.take(unsafe=True) is None and early._started == {} and not started.alive
