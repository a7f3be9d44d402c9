"""CPU (CI): the benchmark's tables and plot, for memory-bound ops (TB/s against the copy) and
compute-bound ones (TFLOP/s against the dense GEMM probe), from hand-made results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmcompile.bench import grid
from llmcompile.bench.baselines import parse_baselines
from llmcompile.specs import OpError


def _result() -> grid.BenchResult:
    res = grid.BenchResult("H100", 3.0, {}, copies={"cute copy bf16": 3.0}, read_tbs=3.1, compute={"bfloat16": 760.0})
    res.rows += [
        grid.BenchRow("softmax", "bfloat16", 4096, 4096, "llmcompile", 0.1, 2.9, 96.7),
        grid.BenchRow("softmax", "bfloat16", 4096, 4096, "quack", 0.1, 2.8, 93.3),
        grid.BenchRow("attention", "bfloat16", 16, 16384, "llmcompile", 6.0, 350.0, 46.1, "", "TFLOP/s"),
        grid.BenchRow("attention", "bfloat16", 16, 16384, "fa4", 3.0, 700.0, 92.1, "", "TFLOP/s"),
        grid.BenchRow("attention", "bfloat16", 16, 16384, "sdpa_cudnn", None, None, None, "no", "TFLOP/s"),
    ]
    return res


def test_memory_and_compute_rows_get_their_own_tables() -> None:
    md = grid.markdown(_result())
    memory, compute = md.split("dense GEMM probe")
    assert "| softmax | bfloat16 | 4096 | 4096 | 2.90 | 2.80 | 96.7 | 1.036 |" in memory
    assert "attention" not in memory and "softmax" not in compute
    assert "bfloat16 760 TFLOP/s" in compute
    assert "| llmcompile TFLOP/s | fa4 TFLOP/s | sdpa_cudnn TFLOP/s | ours % GEMM | ours / fastest other |" in compute
    assert "| attention | bfloat16 | 16 | 16384 | 350 | 700 | n/a | 46.1 | 0.500 |" in compute


def test_each_plot_panel_draws_its_own_limit(tmp_path: Path) -> None:
    res = _result()
    assert res.ceiling("attention", "bfloat16") == 760.0 and res.ceiling("softmax", "bfloat16") == 3.0
    paths = grid.write(res, tmp_path, "mixed")
    assert all(p.stat().st_size > 0 for p in paths.values())
    assert '"gemm_tflops": {' in paths["json"].read_text()


def test_unknown_baseline_is_refused_by_name() -> None:
    assert parse_baselines("fa4,sdpa_flash") == ["fa4", "sdpa_flash"]
    with pytest.raises(OpError, match="unknown baseline fa5; known: eager, compile, quack, liger, sdpa_flash"):
        parse_baselines("fa4,fa5")


def test_timed_output_check_runs_after_every_implementation(monkeypatch: pytest.MonkeyPatch) -> None:
    """The float64 check of what our timed calls wrote lowers the GPU's clocks for seconds, so
    it runs after the baselines are timed (not between ours and theirs), and the GPU settles
    before anything else is timed; a wrong output still marks our row."""
    from llmcompile.bench import timing
    from llmcompile.specs import get_op

    events: list[str] = []
    monkeypatch.setattr(grid, "input_sets", lambda *a, **k: [["x"]])
    monkeypatch.setitem(grid.BASELINES, "quack", lambda spec, s, sc: lambda: events.append("quack call"))

    def fake_time(calls, graph=True, keep=False):
        for c in calls:
            c()
        events.append("timed")
        return timing.Timing(1.0, 1.0, 1, graph, replay=(lambda: events.append("replayed")) if keep else None)

    monkeypatch.setattr(timing, "time_calls", fake_time)
    monkeypatch.setattr(timing, "settle", lambda seconds=0.0: events.append("settle"))

    def check(sets, replay):
        events.append("check")
        replay()  # (ours, kept: the baselines' work is not)
        return "row 3 differs"

    rows = grid.bench_one(
        get_op("softmax"), lambda *s: events.append("ours call"), 4, 1024, "bfloat16", 3.0, ["quack"], check=check
    )
    assert events == ["ours call", "timed", "quack call", "timed", "check", "replayed", "settle"]
    assert "WRONG TIMED OUTPUT: row 3 differs" in rows[0].note and not rows[1].note


def test_rounds_take_turns_and_each_keeps_its_median(monkeypatch: pytest.MonkeyPatch) -> None:
    """With rounds, ours and each baseline are timed in turn (in a rotated order) and each row is
    its median round; a baseline that fails in a round is reported, not retried."""
    from llmcompile.bench import timing
    from llmcompile.specs import get_op

    order: list[str] = []
    times = {"llmcompile": iter([3.0, 1.0, 2.0]), "quack": iter([5.0, 4.0, 6.0])}
    monkeypatch.setattr(grid, "input_sets", lambda *a, **k: [["x"]])
    monkeypatch.setitem(grid.BASELINES, "quack", lambda spec, s, sc: lambda: "quack")
    monkeypatch.setitem(grid.BASELINES, "eager", lambda spec, s, sc: lambda: "eager")

    def fake_time(calls, graph=True):
        name = calls[0]() or "llmcompile"
        order.append(name)
        if name == "eager":
            raise RuntimeError("no kernel")
        t = next(times[name])
        return timing.Timing(t, t, 1, graph)

    monkeypatch.setattr(timing, "time_calls", fake_time)
    monkeypatch.setattr(grid.torch.cuda, "synchronize", lambda: None)  # (after the failure; no GPU here)
    rows = grid.bench_one(
        get_op("softmax"), lambda *s: None, 4, 1024, "bfloat16", 3.0, ["quack", "eager"], graph=False, rounds=3
    )
    assert order == ["llmcompile", "quack", "eager", "quack", "llmcompile", "llmcompile", "quack"]
    assert [r.ms for r in rows[:2]] == [2.0, 5.0]
    assert rows[0].rounds_ms == [3.0, 1.0, 2.0] and rows[1].rounds_ms == [5.0, 4.0, 6.0]
    assert rows[2].tbs is None and "RuntimeError: no kernel" in rows[2].note


def test_rounds_show_how_far_the_ratio_moved() -> None:
    """With rounds, the memory table gives the lowest and highest ratio to QuACK of any one round
    (the two timed back to back in it), beside the ratio of the medians; without, no such column."""
    res = grid.BenchResult("H100", 3.0, {}, copies={"cute copy bf16": 3.0}, read_tbs=3.1)
    res.rows += [
        grid.BenchRow("softmax", "bfloat16", 32768, 2048, "llmcompile", 1.0, 2.88, 96.0, rounds_ms=[1.0, 1.02, 0.99]),
        grid.BenchRow("softmax", "bfloat16", 32768, 2048, "quack", 1.0, 2.88, 96.0, rounds_ms=[1.0, 1.0, 1.0]),
        grid.BenchRow("rmsnorm", "bfloat16", 32768, 256, "llmcompile", 1.0, 2.0, 66.7, rounds_ms=[1.0, 1.0, 1.0]),
        grid.BenchRow("rmsnorm", "bfloat16", 32768, 256, "quack", None, None, None, "failed"),
    ]
    md = grid.markdown(res)
    assert "| ours % SOL | ours / QuACK | ours / QuACK by round |" in md
    assert "| softmax | bfloat16 | 32768 | 2048 | 2.88 | 2.88 | 96.0 | 1.000 | 0.980-1.010 |" in md
    assert "| rmsnorm | bfloat16 | 32768 | 256 | 2.00 | n/a | 66.7 | n/a | n/a |" in md
    assert "by round" not in grid.markdown(_result())


def test_a_grid_read_back_from_its_json_is_the_same_grid(tmp_path: Path) -> None:
    res = _result()
    back = grid.BenchResult.from_json(json.loads(json.dumps(res.to_json())))
    assert back == res
    grid.plot(back, tmp_path / "again.png")  # (evals/scripts/replot.py: the plots a results folder no longer keeps)
    assert (tmp_path / "again.png").stat().st_size > 1000


def test_an_interrupted_grid_keeps_what_it_measured() -> None:
    """Ctrl-C (or a time limit's SIGINT) in the middle of a grid: the points measured stay, the
    result says it was cut short, and its JSON keeps saying so; a ratio to eager is shown."""
    res = grid.BenchResult("H100", 3.0, {}, copies={"cute copy bf16": 3.0})
    with grid.until_interrupted(res, lambda line: None):
        res.rows += [
            grid.BenchRow("softmax", "bfloat16", 32768, 2048, "llmcompile", 1.0, 2.8, 93.0),
            grid.BenchRow("softmax", "bfloat16", 32768, 2048, "eager", 2.0, 1.4, 46.5),
        ]
        raise KeyboardInterrupt
    assert res.interrupted == "interrupted after 1 points" and len(res.rows) == 2
    md = grid.markdown(res)
    assert "| softmax | bfloat16 | 32768 | 2048 | 2.80 | 1.40 | 93.0 | n/a | 2.000 |" in md
    assert "(interrupted after 1 points: the grid is not complete)" in md
    assert grid.BenchResult.from_json(json.loads(json.dumps(res.to_json()))).interrupted == res.interrupted


def test_the_wall_clock_is_the_fastest_of_several_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host stalled during one run (another judge's compile, a preemption) must not make an
    honest kernel's events look short beside the wall clock (TIMER MISMATCH); work that escapes
    the timed stream slows every run, and still shows."""
    import time

    import torch

    from llmcompile.bench import timing

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    stalls = iter([0.03, 0.0, 0.0])

    def run() -> None:
        time.sleep(0.01 + next(stalls))

    ms = timing.wall_ms(run)
    assert 10 <= ms < 25  # (not the stalled run's 40)
    honest = timing.Timing(median_ms=ms, min_ms=ms, samples=3, graph=True, wall_ms=ms)
    assert not honest.events_disagree
    cheat = timing.Timing(
        median_ms=ms / 3, min_ms=ms / 3, samples=3, graph=True, wall_ms=timing.wall_ms(lambda: time.sleep(0.01))
    )
    assert cheat.events_disagree


def test_the_gpu_is_calm_only_after_several_clean_probes_in_a_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """Calm takes CALM_RUNS clean looks in a row; after its time the judge says what was wrong."""
    from llmcompile.bench import timing

    monkeypatch.setattr(timing.time, "sleep", lambda s: None)
    busy = "events 0.13 ms vs wall clock 0.27 ms"
    looks = iter([busy, None, None, busy, None, None, None, busy])
    monkeypatch.setattr(timing, "disturbance", lambda copy_tbs: next(looks))
    assert timing.wait_calm(3.0) is None
    assert next(looks) == busy  # (it stopped at the third clean look in a row)
    monkeypatch.setattr(timing, "disturbance", lambda copy_tbs: busy)
    assert timing.wait_calm(3.0, seconds=0.0) == busy


@pytest.mark.parametrize(
    "events, wall, rate, busy",
    [
        (0.1278, 0.1282, 4.2, False),  # H200 alone
        (0.1276, 0.2720, 4.2, True),  # beside another process copying (2.13x)
        (0.1276, 0.2450, 4.2, True),  # 1.92x: under a candidate's 2x flag, still another process's mark
        (0.1278, 0.1282, 2.0, True),  # the copy at half the rate the worker measured
    ],
)
def test_the_probe_reads_another_process_below_a_candidates_flag(events: float, wall: float, rate: float, busy: bool):
    """A candidate's 2x is at the border of another process's mark (timing.CALM_WALL)."""
    from llmcompile.bench import timing

    t = timing.Timing(median_ms=events, min_ms=events, samples=5, graph=True, wall_ms=wall)
    assert (timing.probe_says(t, rate, 4.2) is not None) == busy


def test_only_the_named_implementation_is_timed_inside_its_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """The judge's inputs are read-only while the candidate is timed, never while a baseline is:
    a baseline's fault there would be blamed on the candidate."""
    from contextlib import contextmanager

    from llmcompile.bench import timing

    inside = [False]
    seen: list[tuple[str, bool]] = []

    @contextmanager
    def read_only():
        inside[0] = True
        yield
        inside[0] = False

    def time_calls(calls, graph=True):
        seen.append((calls[0](), inside[0]))
        return timing.Timing(1.0, 1.0, 1, graph)

    monkeypatch.setattr(timing, "time_calls", time_calls)
    calls = {name: [lambda name=name: name] for name in ("llmcompile", "torch", "compile")}
    grid.time_in_turns(calls, 3, True, {}, inside={"llmcompile": read_only})
    assert sorted(set(seen)) == [("compile", False), ("llmcompile", True), ("torch", False)] and len(seen) == 9


def test_time_in_turns_says_what_each_implementation_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    """`spent`: each implementation's seconds over its turns, one that fails included (its time
    was spent too); None: nothing kept (`timing.spending`)."""
    import time

    import torch

    from llmcompile.bench import timing

    def time_calls(calls, graph=True):
        calls[0]()
        return timing.Timing(1.0, 1.0, 1, graph)

    def fails() -> None:
        time.sleep(0.01)
        raise RuntimeError("a baseline that cannot run")

    monkeypatch.setattr(timing, "time_calls", time_calls)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)  # (after a failure, on the GPU)
    calls = {"llmcompile": [lambda: time.sleep(0.02)], "eager": [lambda: None], "broken": [fails]}
    spent: dict[str, float] = {}
    errors: dict[str, str] = {}
    grid.time_in_turns(calls, 3, True, errors, spent=spent)
    assert set(spent) == {"llmcompile", "eager", "broken"} and "broken" in errors
    assert spent["llmcompile"] >= 3 * 0.02 and 0.01 <= spent["broken"] < 0.02  # (one turn: not timed again)
    assert spent["eager"] < spent["broken"]
    with timing.spending(None, "x"):  # (no dict: nothing to add to, nothing raised)
        pass
