"""Eval metrics on a hand-checked example: four problems, every number worked out by hand.

A  never compiles (2 compile errors)
B  compiles on the 2nd candidate, correct but slower than eager: speedups 0.8 (eager), 0.5 (compile)
C  correct at once and fast: 1.7x eager, 1.2x compile; reached 90% SOL in round 1
D  correct at once and very fast: 2.5x eager, 2.1x compile; reached 90% SOL in round 2
E  not attempted (custom op, no LLM)
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from llmcompile.suites import metrics as M


def _rec(pid, state, compiled, correct, status=None, sp=None, pct=None, hit=None) -> M.ProblemRecord:
    return M.ProblemRecord(
        pid, pid, "bfloat16", state=state, compiled=compiled, correct=correct, best_status=status,
        speedup=sp or {}, min_pct_sol=pct, first_hit=hit or {},
        usage={"prompt_tokens": 1000, "completion_tokens": 100, "requests": len(compiled)} if compiled else {},
    )  # fmt: skip


RECORDS = [
    _rec("A", M.DONE, [False, False], [False, False]),
    _rec("B", M.DONE, [False, True], [False, True], "profiled", {"eager": 0.8, "compile": 0.5}, 40.0),
    _rec("C", M.DONE, [True, True], [True, True], "profiled", {"eager": 1.7, "compile": 1.2}, 95.0,
         {"round": 0, "llm_calls": 2, "tokens": 2200, "wall_s": 60.0}),
    _rec("D", M.DONE, [True], [True], "profiled", {"eager": 2.5, "compile": 2.1}, 99.0,
         {"round": 1, "llm_calls": 4, "tokens": 4400, "wall_s": 100.0}),
    _rec("E", M.NOT_ATTEMPTED, [], []),
]  # fmt: skip


def test_aggregate_by_hand() -> None:
    a = M.aggregate(RECORDS, ks=[1, 2], baselines=["eager", "compile"], target_sol=90.0)
    assert a["problems"] == 5 and a["states"]["done"] == 4 and a["states"]["not_attempted"] == 1
    # compile@1: C, D of 5; compile@2: B, C, D of 5. correct is the same here.
    assert a["compile_at"] == {"1": 0.4, "2": 0.6}
    assert a["correct_at"] == {"1": 0.4, "2": 0.6}
    # fast_p over all 5 problems; B is correct but slower than eager, so never counts
    assert a["fast_p"]["eager"] == {"1.0": 0.4, "1.5": 0.4, "2.0": 0.2}
    assert a["fast_p"]["compile"] == {"1.0": 0.4, "1.5": 0.2, "2.0": 0.2}
    # geomean over the three correct problems B, C, D: (0.8 * 1.7 * 2.5)^(1/3), (0.5 * 1.2 * 2.1)^(1/3)
    g = a["geomean_speedup"]
    assert g["eager"]["over"] == g["compile"]["over"] == 3
    assert g["eager"]["value"] == pytest.approx(3.4 ** (1 / 3)) and g["compile"]["value"] == pytest.approx(
        1.26 ** (1 / 3)
    )
    # % SOL: unsolved problems count as 0 -> [0, 40, 95, 99, 0]
    assert a["sol"]["median_min_pct"] == 40.0 and a["sol"]["reached_target"] == 2
    assert a["sol"]["mean_min_pct"] == pytest.approx(234 / 5)
    c = a["cost_to_target"]
    assert c["reached"] == 2
    assert c["rounds"] == {"median": 1.5, "max": 2} and c["llm_calls"] == {"median": 3, "max": 4}
    assert c["tokens"] == {"median": 3300, "max": 4400} and c["wall_s"] == {"median": 80.0, "max": 100.0}
    assert a["usage"] == {"requests": 7, "tokens": 4 * 1100, "wall_s": 0.0}


def test_compile_only_has_no_correctness_or_speed() -> None:
    recs = [_rec("A", M.DONE, [True], [False])]
    recs[0].compile_only = True
    a = M.aggregate(recs, ks=[1], baselines=["eager"])
    assert a["compile_at"] == {"1": 1.0} and a["correct_at"] is None and a["fast_p"] is None and a["sol"] is None


def test_geomean_speedup_by_hand() -> None:
    shapes = [
        {"ms": 1.0, "baseline_ms": {"eager": 2.0, "compile": 1.0}},
        {"ms": 2.0, "baseline_ms": {"eager": 1.0}},
    ]
    assert M.geomean_speedup(shapes, "eager") == pytest.approx(1.0)  # sqrt(2 * 0.5)
    assert M.geomean_speedup(shapes, "compile") == pytest.approx(1.0)
    assert M.geomean_speedup(shapes, "liger") is None


def _verdict(status: str, compiled: bool, correct: bool) -> dict:
    return {
        "status": status,
        "compile": {"ok": compiled} if status != "static_rejected" else None,
        "verify": {"ok": correct} if compiled and status != "compiled" else None,
    }


def test_collect_reads_a_run_directory(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "candidates").mkdir(parents=True)
    order = [(1, 0, "profiled", True, True), (0, 1, "wrong", True, False), (0, 0, "compile_error", False, False)]
    for r, s, st, comp, corr in order:
        v = {**_verdict(st, comp, corr),
             "timeline": {"compile": 2.0, "seal": 0.5, "gpu_wait": 9.0, "load": 0.25, "verify": 1.0 * r}}  # fmt: skip
        rec = {"id": f"c{r:02d}_{s:02d}", "round": r, "sample": s, "verdict": v}
        (run / "candidates" / f"c{r:02d}_{s:02d}.json").write_text(json.dumps(rec))
    shapes = [
        {"m": 8, "n": 1024, "ms": 1.0, "tbs": 2.0, "pct_sol": 80.0, "baselines": {},
         "baseline_ms": {"eager": 4.0, "compile": 2.0}},
        {"m": 8, "n": 4096, "ms": 1.0, "tbs": 2.0, "pct_sol": 90.0, "baselines": {},
         "baseline_ms": {"eager": 1.0, "compile": 0.5}},
    ]  # fmt: skip
    summary = {
        "provider": "openai", "llm_used": True, "rounds": 2, "judged": 3, "wall_s": 12.0,
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "requests": 3},
        "first_hit": {}, "best": {"id": "c01_00", "status": "profiled", "min_pct_sol": 80.0,
                                  "mean_pct_sol": 85.0, "shapes": shapes},
        "timeline": {"startup_s": 4.0, "finalize_s": 6.0, "gpu_warmed_s": 7.5,
                     "stages": {"compile": 6.0, "verify": 1.0, "baselines": 5.0},
                     "profile_phases": {"candidate": 1.5, "eager": 2.0}},
    }  # fmt: skip
    (run / "summary.json").write_text(json.dumps(summary))
    rec = M.collect(M.ProblemRecord("p", "p", "bfloat16", state=M.DONE), run)
    assert rec.statuses == ["compile_error", "wrong", "profiled"]  # asked order, not file order
    assert rec.compiled == [False, True, True] and rec.correct == [False, False, True]
    assert rec.speedup["eager"] == pytest.approx(2.0) and rec.speedup["compile"] == pytest.approx(1.0)
    assert rec.min_pct_sol == 80.0 and rec.best_correct and rec.llm_used
    assert math.isclose(M.aggregate([rec], [1, 3], ["eager"])["fast_p"]["eager"]["1.5"], 1.0)
    # each candidate's own judge seconds (the wait for the GPU is another's), the run's stages
    # (the problem and kernel loaded in the GPU worker are its own too)
    assert rec.candidate_s == [2.75, 2.75, 3.75] and rec.stage_s["startup"] == 4.0 and rec.stage_s["baselines"] == 5.0
    rec.process_s = 36.0
    t = M.aggregate([rec], [1, 3], ["eager"])["throughput"]
    assert t["candidates"] == 3 and t["candidates_per_gpu_hour"] == 300.0 and t["median_candidate_s"] == 2.75
    assert t["median_gpu_start_s"] == 7.5  # process start to the GPU worker's bandwidth measured
    # the profile's phases, summed over the problems (not among the stages: they are the profile's)
    assert t["profile_phases_s"] == {"candidate": 1.5, "eager": 2.0} and "candidate" not in t["stages_s"]
    twice = M.aggregate([rec, rec], [1], ["eager"])["throughput"]["profile_phases_s"]
    assert twice == {"candidate": 3.0, "eager": 4.0}


def test_a_run_that_waited_for_its_gpu_turn_is_charged_from_the_turn(tmp_path: Path) -> None:
    """Two agents on one GPU: the second's wait while the first judged is not GPU time, and its
    GPU worker's start counts from its turn (otherwise GPU-hours would count that wait twice)."""
    run = tmp_path / "run"
    run.mkdir()
    timeline = {"startup_s": 4.0, "gpu_turn_s": 5.0, "gpu_warmed_s": 7.5, "stages": {}}
    (run / "summary.json").write_text(json.dumps({"judged": 0, "timeline": timeline}))
    rec = M.collect(M.ProblemRecord("p", "p", "bfloat16", state=M.DONE, process_s=41.0), run)
    assert (rec.gpu_turn_s, rec.gpu_start_s, rec.gpu_s) == (5.0, 2.5, 36.0)
    assert M.aggregate([rec], [1], [])["throughput"]["gpu_hours"] == round(36.0 / 3600, 4)
    alone = M.ProblemRecord("p", "p", "bfloat16", state=M.DONE, process_s=41.0)
    assert alone.gpu_turn_s is None and alone.gpu_s == 41.0
    # a run that lent its turn while its LLM answered held the GPU that much less
    (run / "summary.json").write_text(json.dumps({"judged": 0, "timeline": {**timeline, "gpu_lent_s": 20.0}}))
    lent = M.collect(M.ProblemRecord("p", "p", "bfloat16", state=M.DONE, process_s=41.0), run)
    assert (lent.gpu_lent_s, lent.gpu_s) == (20.0, 16.0)
