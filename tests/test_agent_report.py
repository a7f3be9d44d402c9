"""The run's closing table (llmcompile/agent/report.py)."""

from __future__ import annotations

from llmcompile.agent.report import _ages, summary_table
from llmcompile.harness.verdict import ProfileResult, ShapeTiming, Verdict


def _summary(unit: str | None) -> dict:
    best = {
        "id": "c00_00",
        "status": "profiled",
        "min_pct_sol": 64.3,
        "dir": "/runs/best",
        "shapes": [{"m": 128, "n": 2048, "tbs": 480.6, "pct_sol": 63.9, "baselines": {"fa4": 539.2}}],
    }
    if unit:
        best["unit"] = unit
    return {
        "op": "attention_causal", "dtype": "bfloat16", "target": "h100", "provider": "offline", "llm_used": False,
        "stop_reason": "round budget spent (2)", "judged": 6, "wall_s": 300.0, "verdicts": {"profiled": 6},
        "best": best,
    }  # fmt: skip


def test_a_compute_bound_run_is_tabled_in_its_own_unit() -> None:
    table = summary_table(_summary("TFLOP/s"))
    assert "| M x N | TFLOP/s | % SOL | fa4 TFLOP/s |" in table and "TB/s" not in table
    assert "| 128 x 2048 | 480.600 | 63.9 | 539.20 |" in table


def test_a_summary_from_before_the_unit_was_recorded_reads_as_bandwidth() -> None:
    assert "| M x N | TB/s | % SOL | fa4 TB/s |" in summary_table(_summary(None))


def test_the_timeline_says_where_a_runs_time_went(tmp_path) -> None:
    """From the run's events: start-up, the first verdict, the first kernel at the target, the
    rounds, the end; each judge stage summed over the candidates."""
    import json

    from llmcompile.agent.report import timeline_of, timeline_table
    from llmcompile.agent.runs import RunStore

    store = RunStore(tmp_path)
    t0 = 1000.0
    events = [
        {"t": t0 + 1, "event": "start", "at": t0},
        {"t": t0 + 4, "event": "round", "round": 0},
        {"t": t0 + 30, "event": "judged", "min_pct": [95.0, 99.0], "finished_at": t0 + 20,
         "stages": {"compile": 6.0, "seal": 1.0, "verify": 3.0, "profile": 8.0,
                    "profile.candidate": 2.0, "profile.eager": 5.0, "profile.other": 1.0}},
        {"t": t0 + 30, "event": "judged", "min_pct": [80.0, 85.0], "finished_at": t0 + 29,
         "stages": {"compile": 5.0, "seal": 1.0, "gpu_wait": 10.0, "verify": 3.0, "profile": 7.0,
                    "profile.candidate": 3.0, "profile.checks": 4.0, "profile.calm": 0.01}},
        {"t": t0 + 30, "event": "stop"},
        {"t": t0 + 30, "event": "judge", "gpu_spawned": t0 + 2, "gpu_ready": t0 + 5, "gpu_warmed": t0 + 7.5},
        {"t": t0 + 31, "event": "finalize"},
        {"t": t0 + 40, "event": "baselines", "seconds": 8.5},
        {"t": t0 + 41, "event": "end"},
    ]  # fmt: skip
    (tmp_path / "timeline.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    tl = timeline_of(store, 90.0)
    assert (tl["startup_s"], tl["first_verdict_s"], tl["to_target_s"]) == (4.0, 20.0, 20.0)
    assert (tl["rounds_s"], tl["finalize_s"], tl["total_s"], tl["candidates"]) == (26.0, 11.0, 41.0, 2)
    assert tl["stages"]["compile"] == 11.0 and tl["stages"]["gpu_wait"] == 10.0 and tl["stages"]["baselines"] == 8.5
    assert "| first kernel at the target % of SOL | 20.0 |" in timeline_table(tl)
    # the GPU worker's start, from the process's: what a fresh judge's first candidate waits for
    assert (tl["gpu_ready_s"], tl["gpu_warmed_s"]) == (5.0, 7.5)
    assert "| the GPU worker's start done (the device's bandwidth measured) | 7.5 |" in timeline_table(tl)
    assert tl["gpu_turn_s"] is None and "turn" not in timeline_table(tl)  # alone on its GPU
    events[5]["gpu_turn"] = t0 + 3.5  # an eval's second agent on the GPU, its turn come
    (tmp_path / "timeline.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    assert "| the GPU this run's (its turn on a GPU other runs shared) | 3.5 |" in timeline_table(
        timeline_of(store, 90.0)
    )
    assert "lent" not in timeline_table(timeline_of(store, 90.0))  # (lent only while an LLM answers)
    events[5]["gpu_lent_s"] = 12.25
    (tmp_path / "timeline.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    lent = timeline_of(store, 90.0)
    assert lent["gpu_lent_s"] == 12.25
    assert "| of them, the GPU lent to other runs while the LLM answered | 12.2 |" in timeline_table(lent)
    # the profile's phases beside the stages, not among them (they are within "profile")
    assert tl["stages"]["profile"] == 15.0 and not any(k.startswith("profile.") for k in tl["stages"])
    assert tl["profile_phases"] == {"candidate": 5.0, "eager": 5.0, "other": 1.0, "checks": 4.0, "calm": 0.01}
    assert "The profile by phase: candidate 5.0, eager 5.0, checks 4.0, other 1.0." in timeline_table(tl)
    assert timeline_of(store, 99.5)["to_target_s"] is None


def test_the_report_says_which_baselines_are_cached_or_may_be_slow() -> None:
    shape = ShapeTiming(8, 8, 0.05, 2.7, 90.0, True, {"eager": 2.0}, {"eager": 0.07}, baseline_age_s={"eager": 7200.0})
    v = Verdict(
        "profiled", "", "softmax", "bfloat16", "h100", "0" * 64, profile=ProfileResult(True, 3.0, shapes=[shape])
    )
    assert "baseline cache: eager (2.0 h ago)" in _ages(v) and "may be slow" not in _ages(v)
    v.profile.disturbed = "the judge's own copy ran at 1.20 TB/s, 40% of the 3.00 it measured"
    assert "may be slow" in _ages(v) and "40% of the 3.00" in _ages(v) and "not kept" in _ages(v)
