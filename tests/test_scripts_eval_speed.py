"""evals.scripts.eval_speed: an eval's speed from its folder, the same for the verdicts of any
version (a timeline, or stages with their seconds), over the wall time it is given."""

from __future__ import annotations

import json
from pathlib import Path

from evals.scripts.eval_speed import own_seconds, speed


def _candidate(folder: Path, problem: str, cid: str, verdict: dict) -> None:
    d = folder / "problems" / problem / "candidates"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{cid}.json").write_text(json.dumps({"id": cid, "verdict": verdict}))


def test_own_seconds_from_a_timeline_or_from_stages() -> None:
    new = {"timeline": {"compile": 2.0, "seal": 0.5, "verify": 1.0, "profile": 1.5, "gpu_wait": 9.0}}
    # no queueing; a timeline from before the load was clocked has none
    assert own_seconds(new) == {"compile": 2.0, "seal": 0.5, "load": 0.0, "verify": 1.0, "profile": 1.5}
    old = {"compile": {"seconds": 5.0}, "verify": {"seconds": 0.4}, "profile": {"seconds": 24.0}, "static": {}}
    assert own_seconds(old) == {"compile": 5.0, "verify": 0.4, "profile": 24.0}


def test_speed_counts_unfinished_problems_and_takes_the_median(tmp_path: Path) -> None:
    _candidate(tmp_path, "a", "c00_00", {"timeline": {"compile": 1.0, "verify": 1.0}})
    _candidate(tmp_path, "a", "c00_01", {"timeline": {"compile": 3.0, "verify": 1.0}})
    _candidate(tmp_path, "b", "c00_00", {"compile": {"seconds": 10.0}, "profile": {"seconds": 10.0}})
    (tmp_path / "problems" / "a" / "summary.json").write_text("{}")  # a done, b cut off
    r = speed(tmp_path, wall_s=180.0, gpus=2)
    assert (r["problems_done"], r["candidates"]) == (1, 3)
    assert r["candidates_per_gpu_hour"] == 30.0  # 3 candidates over 0.1 GPU-hours
    assert r["median_candidate_s"] == 4.0
    assert r["stages_s"]["compile"] == 14.0 and r["stages_s"]["profile"] == 10.0
