"""harness/gpu_turn.py: runs sharing a GPU take it in turn; the GPU worker touches it only on its turn."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from llmcompile.harness import early, gpu_turn
from llmcompile.harness.gpu_turn import Turn
from llmcompile.harness.judge import Judge
from llmcompile.harness.sandbox import ROOT, Layers, Sandbox
from llmcompile.harness.worker import Channel, JudgeFailure, judge_worker


def test_a_lent_turn_is_the_next_runs_until_it_comes_back(tmp_path: Path) -> None:
    """A run waiting on its LLM lends the GPU; asked for again, the turn comes back once the other
    run gives it up. The time lent, and the wait to get it back, are counted apart."""
    lock = str(tmp_path / "0.lock")
    mine = Turn(lock)
    assert mine.wait(5) and mine.lent_for() == 0.0
    assert mine.pause() and mine.lent and not mine.held and not mine.pause()  # (lent once)
    other = Turn(lock)
    assert other.wait(5)
    asked = time.perf_counter()
    mine.resume()
    assert not mine.lent and mine.coming_back and not mine.wait(0.3)
    other.release()
    assert mine.wait(5) and mine.held and not mine.coming_back
    assert mine.waited(asked) >= 0.3 and mine.lent_for() >= 0.3
    assert mine.waited(0.0) == pytest.approx(mine.waited(mine.asked))  # (the first wait and this one)
    assert mine.pause()
    mine.release()  # (ended while lent: what was lent ends with it)
    lent = mine.lent_for()
    time.sleep(0.1)
    assert mine.lent_for() == lent and not mine.coming_back
    assert Turn(lock).wait(5)


def test_runs_sharing_a_gpu_take_it_one_at_a_time(tmp_path: Path) -> None:
    lock = str(tmp_path / "0.lock")
    first = Turn(lock)
    assert first.wait(5) and first.error == ""
    second = Turn(lock)
    assert not second.wait(0.3)  # the first holds it
    assert second.waited(0.0) >= 0.3 and second.taken is None
    first.release()
    assert second.wait(5)
    assert second.waited(second.asked) == pytest.approx(second.taken - second.asked)
    assert second.waited(second.taken + 10) == 0.0  # (none of the wait came after that)
    second.release()


def test_a_turn_given_up_before_it_came_passes_on(tmp_path: Path) -> None:
    """A run that ends while still waiting (interrupted, or never needed the GPU) does not keep the
    next run waiting once its turn would have come."""
    lock = str(tmp_path / "0.lock")
    first = Turn(lock)
    assert first.wait(5)  # (before the second asks: flock serves waiters in no set order)
    second = Turn(lock)
    second.release()
    first.release()
    third = Turn(lock)
    assert third.wait(5)
    assert not second.wait(0)  # never held
    third.release()


HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(600)
"""


def test_a_run_that_dies_gives_the_gpu_back(tmp_path: Path) -> None:
    """However a run ends (killed, out of memory), the kernel frees its lock: nothing to clean up."""
    lock = str(tmp_path / "0.lock")
    other = subprocess.Popen([sys.executable, "-c", HOLDER, lock], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "held"
        mine = Turn(lock)
        assert not mine.wait(0.3)
        other.kill()
        assert mine.wait(5)
        mine.release()
    finally:
        other.kill()
        other.wait()


def test_a_turn_file_that_cannot_be_opened_is_said_and_not_waited_for(tmp_path: Path) -> None:
    t = Turn(str(tmp_path / "no-such-dir" / "0.lock"))
    assert t.wait(0) and "could not be opened" in t.error and "did not wait" in t.error
    t.release()


def test_only_a_run_an_eval_gave_a_lock_takes_turns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(gpu_turn.ENV, raising=False)
    assert gpu_turn.from_env() is None
    assert judge_worker(Sandbox(Layers(), unsafe=True), gpu=True).turn is None
    monkeypatch.setenv(gpu_turn.ENV, str(tmp_path / "0.lock"))
    gpu = judge_worker(Sandbox(Layers(), unsafe=True), gpu=True)
    sealer = judge_worker(Sandbox(Layers(), unsafe=True), gpu=False)
    try:
        assert gpu.turn is not None and gpu.env["LLMCOMPILE_WORKER_TURN"] == "1"
        assert sealer.turn is None and "LLMCOMPILE_WORKER_TURN" not in sealer.env  # (sealers use no GPU)
    finally:
        for ch in (gpu, sealer):
            ch.dispose()


# says `ready` only after its first line, and says what that line was; ends every job soundly
GATED_WORKER = """
import json, sys, time
went = sys.stdin.readline().strip()
print(json.dumps({"event": "ready", "pid": 0, "at": time.time(), "went": went}), flush=True)
for line in sys.stdin:  # (the judge's "warm", "rest", "ping")
    print(json.dumps({"event": "result", "stage": json.loads(line)["kind"], "data": {}}), flush=True)
    print(json.dumps({"event": "done"}), flush=True)
"""


def test_the_gpu_worker_starts_on_the_gpu_only_on_its_turn(tmp_path: Path) -> None:
    """Its imports overlap the other run's judging; `go`, and with it a CUDA context, waits for the
    turn. The start-up deadline counts from the turn, so a long wait is no judge failure."""
    (tmp_path / "gated_worker.py").write_text(GATED_WORKER)
    lock = str(tmp_path / "0.lock")
    other = Turn(lock)
    assert other.wait(5)
    ch = Channel(
        "gated_worker",
        Sandbox(Layers(), unsafe=True),
        env={"PYTHONPATH": f"{tmp_path}:{ROOT}"},
        timeouts={"start": 0.5},
        turn=Turn(lock),
    )
    try:
        ch.start()
        waiting = threading.Thread(target=ch.wait_ready)
        waiting.start()
        time.sleep(1.5)  # three start deadlines
        assert waiting.is_alive() and ch.ready is None and ch.alive
        released = time.time()
        other.release()
        waiting.join(10)
        assert ch.ready is not None and ch.ready["went"] == "go" and ch.ready["at"] >= released
        facts = Judge.start_facts(SimpleNamespace(gpu_worker=ch, _warmed_at=0.0))
        assert released <= facts["gpu_turn"] <= facts["gpu_ready"]
        assert Judge.turn_wait(SimpleNamespace(turn=ch.turn), 0.0) >= 1.5
    finally:
        ch.dispose()
    assert Turn(lock).wait(5)  # disposed: the GPU is the next run's


def test_the_real_gpu_worker_waits_for_go_before_cuda(tmp_path: Path) -> None:
    """The judge's own GPU worker, under LLMCOMPILE_WORKER_TURN: it imports, then waits; without
    `go` it never creates a CUDA context, and a judge that goes away ends it."""
    lock = str(tmp_path / "0.lock")
    other = Turn(lock)
    assert other.wait(5)
    env = {"LLMCOMPILE_WORKER_GPU": "1", "CUDA_VISIBLE_DEVICES": ""}  # (the sandbox's PYTHONPATH: the project's, ours)
    ch = Channel("llmcompile.harness.worker", Sandbox(Layers(), unsafe=True), gpu=True, env=env, turn=Turn(lock))
    try:
        ch.start()
        time.sleep(8)  # (its imports: CuTe DSL and torch)
        assert ch.alive and "cuda" not in ch.log_tail().lower(), ch.log_tail()
        assert ch.proc is not None and ch.proc.stdin is not None
        ch.proc.stdin.close()  # the judge gone before the turn came
        assert ch.proc.wait(30) == 0
    finally:
        other.release()
        ch.dispose()


@pytest.mark.gpu
def test_two_judges_on_one_gpu_take_it_in_turn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the GPU: a second judge given the same lock starts up (its processes, its imports) but
    its GPU worker says ready, a CUDA context made, only once the first judge is closed."""
    monkeypatch.setenv(gpu_turn.ENV, str(tmp_path / "0.lock"))
    monkeypatch.setenv("LLMCOMPILE_CPUS", "2")
    first = Judge(gpu=True, compile_workers=1)
    try:
        assert first.gpu_facts()["gpu_total"] > 0
        second = Judge(gpu=True, compile_workers=1)
        try:
            assert second.gpu_worker is not None
            time.sleep(10)  # (its imports take 2-3 s)
            assert second.gpu_worker.alive and second.gpu_worker.ready is None
            closing = time.time()
            first.close()  # (its GPU worker gone, the turn is the second's)
            assert second.gpu_facts()["gpu_total"] > 0
            f = second.start_facts()
            assert closing <= f["gpu_turn"] <= f["gpu_ready"]
        finally:
            second.close()
    finally:
        first.close()


def test_what_a_problems_load_imports_comes_before_the_turn() -> None:
    """The GPU worker imports what loading a KernelBench file needs before its CUDA context (and
    its turn): the load in the timed job then imports the file alone (it took 0.9-1.1 s)."""
    code = (
        "import sys\n"
        "from llmcompile.harness.worker import before_the_gpu\n"
        "from llmcompile.specs.kernelbench import load_problem\n"
        "before_the_gpu()\n"
        "before = set(sys.modules)\n"
        f"load_problem({str(ROOT / 'evals/problems/swiglu.py')!r}, independent_rows=True)\n"
        "print(*sorted(set(sys.modules) - before))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    new = out.stdout.split()
    assert len(new) == 1 and new[0].startswith("llmcompile_problem_"), new[:20]  # the file alone, nothing of torch's


PROBES_BEFORE_THE_GPU = """
from llmcompile.harness.worker import before_the_gpu
from llmcompile.runtime.compiled import copy, cross_entropy
before_the_gpu()
print(sorted(copy._compiled), sorted(cross_entropy._compiled))
import torch
if torch.cuda.is_available():  # no CUDA context yet: the compiles are host work
    from cuda.bindings import driver
    driver.cuInit(0)
    err, flags, active = driver.cuDevicePrimaryCtxGetState(0)
    print("primary context active:", int(active), "torch initialised:", torch.cuda.is_initialized())
"""


def test_the_bandwidths_probes_compile_before_the_turn() -> None:
    """The `warm` job's kernels (our copy and cross-entropy) compile while the worker waits for
    its turn, not after it."""
    out = subprocess.run(
        [sys.executable, "-c", PROBES_BEFORE_THE_GPU], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[0] == "[('bfloat16', 4096)] [('float32', 16384)]", out.stdout


@pytest.mark.gpu
def test_the_bandwidths_probes_compile_before_the_turn_without_a_cuda_context() -> None:
    """On a GPU: compiling them makes no CUDA context (the waiting run touches no GPU)."""
    out = subprocess.run(
        [sys.executable, "-c", PROBES_BEFORE_THE_GPU], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "primary context active: 0 torch initialised: False" in out.stdout, out.stdout


def _started_early(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, turn: Turn) -> Channel:
    """The gated fake GPU worker as `early.start` leaves it, for the next judge to take."""
    (tmp_path / "gated_worker.py").write_text(GATED_WORKER)
    box = Sandbox(Layers(), unsafe=True)
    ch = Channel("gated_worker", box, env={"PYTHONPATH": f"{tmp_path}:{ROOT}"}, turn=turn)
    ch.start()
    monkeypatch.setattr(early, "_started", {False: (box, ch)})
    monkeypatch.setenv("LLMCOMPILE_CPUS", "2")  # (one sealer, one candidate process)
    return ch


def test_a_run_gives_the_gpu_up_once_it_will_time_nothing_more(tmp_path: Path, monkeypatch) -> None:
    """Its report still being written, the next run on the GPU may start on it; a judge asked to use
    the GPU after giving it up says it is its own bug, and uses no GPU without the turn."""
    lock = str(tmp_path / "0.lock")
    ch = _started_early(tmp_path, monkeypatch, Turn(lock))
    with Judge(gpu=True, compile_workers=1) as j:
        assert j.gpu_worker is ch and j.gpu_facts()["went"] == "go"
        nxt = Turn(lock)
        assert not nxt.wait(0.3)
        j.release_gpu()
        assert nxt.wait(5) and not ch.alive
        with pytest.raises(JudgeFailure, match="gave its GPU up"):
            j.gpu_facts()
    nxt.release()


def test_a_run_done_before_its_turn_came_ends_without_waiting_for_it(tmp_path: Path, monkeypatch) -> None:
    """Its candidates all failed before the GPU: giving the GPU up stops the start that waited for
    the turn (no `go`, no CUDA context), and the run ends while the other still holds the GPU."""
    lock = str(tmp_path / "0.lock")
    other = Turn(lock)
    assert other.wait(5)
    ch = _started_early(tmp_path, monkeypatch, Turn(lock))
    with Judge(gpu=True, compile_workers=1) as j:
        time.sleep(0.5)  # (its warm-up now waits for the turn, holding the GPU worker)
        giving_up = threading.Thread(target=j.release_gpu, daemon=True)
        giving_up.start()
        giving_up.join(5)
        assert not giving_up.is_alive() and ch.ready is None and not ch.alive
    assert other.held
    other.release()


def test_a_run_lends_its_gpu_while_its_llm_answers(tmp_path: Path, monkeypatch) -> None:
    """`lend_gpu` (the loop, before it asks the LLM): the worker rests, and the next run on the GPU
    may take it; the next exchange waits for it back, a wait that is not the run's time."""
    lock = str(tmp_path / "0.lock")
    ch = _started_early(tmp_path, monkeypatch, Turn(lock))
    with Judge(gpu=True, compile_workers=1) as j:
        assert j.gpu_facts()["went"] == "go"
        while not j.start_facts().get("gpu_warmed"):
            time.sleep(0.05)  # (lent at once only where the worker is idle)
        j.lend_gpu()
        assert j.turn is not None and j.turn.lent and ch.alive
        other = Turn(lock)
        assert other.wait(5)  # the next run judges meanwhile
        j.want_gpu()
        asking = threading.Thread(target=j.gpu_facts)
        asking.start()
        asking.join(0.5)
        assert asking.is_alive() and not j.turn.held  # the other still has it
        other.release()
        asking.join(5)
        assert not asking.is_alive() and j.turn.held
        assert j.turn_wait(0.0) >= 0.5 and j.start_facts()["gpu_lent_s"] >= 0.5


def test_a_gpu_asked_to_be_lent_during_start_up_is_lent_once_it_is_warm(tmp_path: Path, monkeypatch) -> None:
    """The first LLM call comes while the GPU worker still waits for its first turn: the loop is not
    held up, and the GPU is lent as soon as the worker's start-up is done."""
    lock = str(tmp_path / "0.lock")
    first = Turn(lock)
    assert first.wait(5)
    _started_early(tmp_path, monkeypatch, Turn(lock))
    with Judge(gpu=True, compile_workers=1) as j:
        t0 = time.perf_counter()
        j.lend_gpu()
        assert time.perf_counter() - t0 < 0.5 and j.turn is not None and not j.turn.lent  # not yet held
        first.release()
        while j.turn.taken is None:  # (its own turn first: flock serves waiters in no set order)
            time.sleep(0.01)
        nxt = Turn(lock)
        assert nxt.wait(10)  # warmed, then lent
        assert j.turn.lent and j.start_facts().get("gpu_warmed")
        nxt.release()
