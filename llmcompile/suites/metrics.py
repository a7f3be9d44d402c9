"""Metrics of an eval, computed from the per-problem run directories the agent wrote.

Definitions (the report states them too):
- compile@k / correct@k: the fraction of problems where at least one of the first k
  candidates, in the order they were asked (round, then sample), compiled / was verified
  correct. k is counted in candidates, not rounds; a run that stopped early with fewer
  than k candidates counts what it judged.
- fast_p vs a baseline (KernelBench's definition): the fraction of all problems in the
  suite whose best kernel is correct and faster than the baseline by more than p. A
  problem's speedup is the geometric mean over its benchmark shapes of baseline time /
  kernel time, both timed in the same process on the same inputs.
- % SOL: the best kernel's throughput on its slowest shape, as % of the device copy
  bandwidth measured in the same process.
- cost to the target: rounds, LLM calls, tokens and wall time spent when the best first
  reached the target % of SOL on every shape.
- throughput: candidates judged per GPU-hour (the agent processes' wall time on their GPUs,
  start-up and the final baselines included, less any wait for a turn on a shared GPU), each
  candidate's own judge seconds (compile, seal, load, verify, profile: its median), and every
  stage's seconds summed over the eval.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmcompile.harness.verdict import PROFILED, SUSPICIOUS, VERIFIED

DONE = "done"  # the agent ran to a stop (a best kernel or not)
NOT_ATTEMPTED = "not_attempted"  # e.g. a custom op with no LLM: the offline search cannot write it
FAILED = "failed"  # the agent process failed (its log says why)
# the judge could not run (its own failure, never a verdict on the candidate): not the model's
# result, so a rerun of the eval runs the problem again, as it does a pending one
JUDGE_FAILED = "judge_failed"
PENDING = "pending"  # not run yet (or interrupted): a rerun of the eval continues it

FAST_P = (1.0, 1.5, 2.0)


@dataclass
class ProblemRecord:
    id: str
    op: str
    dtype: str
    state: str = PENDING
    reason: str = ""
    provider: str = ""
    llm_used: bool = False
    compile_only: bool = False
    statuses: list[str] = field(default_factory=list)  # every candidate's verdict, in asked order
    compiled: list[bool] = field(default_factory=list)
    correct: list[bool] = field(default_factory=list)
    best_id: str | None = None
    best_status: str | None = None
    min_pct_sol: float | None = None
    mean_pct_sol: float | None = None
    speedup: dict[str, float] = field(default_factory=dict)  # baseline -> geomean(baseline ms / ours)
    shapes: list[dict[str, Any]] = field(default_factory=list)
    first_hit: dict[str, Any] = field(default_factory=dict)
    rounds: int = 0
    judged: int = 0
    usage: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0
    run_dir: str = ""
    # KernelBench's verdict (allclose to torch's own output, atol=rtol=1e-2) on the best kernel's
    # verified and timed outputs; None where it was not checked
    kernelbench_correct: bool | None = None
    gpu: str | None = None  # the CUDA_VISIBLE_DEVICES it ran under; None: compile-only or not run
    process_s: float = 0.0  # the agent process's wall time
    gpu_turn_s: float | None = None  # process start to its turn on a GPU other runs shared; None: alone
    gpu_lent_s: float = 0.0  # its turn lent to other runs while its LLM answered, until it came back
    candidate_s: list[float] = field(default_factory=list)  # each candidate's own judge seconds
    stage_s: dict[str, float] = field(default_factory=dict)  # each stage, summed over the run
    profile_phases_s: dict[str, float] = field(default_factory=dict)  # the profile's, by phase, summed
    gpu_start_s: float | None = None  # process start (or its GPU turn) to the GPU worker's bandwidth measured

    @property
    def gpu_s(self) -> float:
        """What it held its GPU for: its process's wall time, less any wait for its turn and the
        time it lent the turn to other runs."""
        return self.process_s - (self.gpu_turn_s or 0.0) - self.gpu_lent_s

    @property
    def best_correct(self) -> bool:
        return self.best_status in (VERIFIED, PROFILED)


def geomean_speedup(shapes: list[dict[str, Any]], baseline: str) -> float | None:
    ratios = [
        s["baseline_ms"][baseline] / s["ms"] for s in shapes if s.get("ms") and s.get("baseline_ms", {}).get(baseline)
    ]
    return statistics.geometric_mean(ratios) if ratios else None


def _compiled(v: dict[str, Any]) -> bool:
    return bool(v.get("compile") and v["compile"].get("ok"))


def _correct(v: dict[str, Any]) -> bool:
    return bool(v.get("verify") and v["verify"].get("ok"))


def kernelbench_verdict(v: dict[str, Any]) -> bool | None:
    """KernelBench's verdict on a candidate: every comparison of its verified and timed outputs
    within atol=rtol=1e-2 of torch's own; None when none was made."""
    tallies = [st["kernelbench"] for st in (v.get("verify"), v.get("profile")) if st and st.get("kernelbench")]
    tallies = [t for t in tallies if t.get("checked")]
    if not tallies:
        return None
    return all(t["passed"] == t["checked"] for t in tallies)


def collect(rec: ProblemRecord, run_dir: Path) -> ProblemRecord:
    """Fill `rec` from an agent run directory (candidates/*.json and summary.json)."""
    rec.run_dir = str(run_dir)
    cands = []
    by_id: dict[str, dict[str, Any]] = {}
    for f in (run_dir / "candidates").glob("*.json"):
        c = json.loads(f.read_text())
        cands.append((c["round"], c["sample"], c["verdict"]))
        by_id[c.get("id", f.stem)] = c["verdict"]
    cands.sort(key=lambda c: (c[0], c[1]))
    own = ("compile", "seal", "load", "verify", "profile", "attribute")
    rec.candidate_s = [round(sum(v.get("timeline", {}).get(k, 0.0) for k in own), 3) for _, _, v in cands]
    rec.statuses = [v["status"] for _, _, v in cands]
    rec.compiled = [_compiled(v) for _, _, v in cands]
    rec.correct = [_correct(v) for _, _, v in cands]
    sp = run_dir / "summary.json"
    if not sp.is_file():
        return rec
    s = json.loads(sp.read_text())
    cfg_path = run_dir / "config.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
    rec.provider = s.get("provider", "")
    rec.llm_used = bool(s.get("llm_used"))
    rec.compile_only = bool(cfg.get("compile_only"))
    rec.first_hit = s.get("first_hit") or {}
    rec.rounds = s.get("rounds", 0)
    rec.judged = s.get("judged", 0)
    rec.usage = s.get("usage", {})
    rec.wall_s = s.get("wall_s", 0.0)
    tl = s.get("timeline") or {}
    rec.stage_s = {**tl.get("stages", {}), "startup": tl.get("startup_s") or 0.0, "end": tl.get("finalize_s") or 0.0}
    rec.profile_phases_s = dict(tl.get("profile_phases") or {})
    rec.gpu_turn_s = tl.get("gpu_turn_s")
    rec.gpu_lent_s = tl.get("gpu_lent_s") or 0.0
    warmed = tl.get("gpu_warmed_s")
    rec.gpu_start_s = None if warmed is None else round(warmed - (rec.gpu_turn_s or 0.0), 2)
    best = s.get("best")
    if best:
        rec.best_id = best["id"]
        rec.best_status = best["status"]
        if best["id"] in by_id:
            rec.kernelbench_correct = kernelbench_verdict(by_id[best["id"]])
        if best["status"] in (PROFILED, SUSPICIOUS) and best.get("shapes"):
            rec.min_pct_sol = best["min_pct_sol"]
            rec.mean_pct_sol = best["mean_pct_sol"]
            rec.shapes = best["shapes"]
            for b in sorted({k for sh in best["shapes"] for k in sh.get("baseline_ms", {})}):
                g = geomean_speedup(best["shapes"], b)
                if g is not None:
                    rec.speedup[b] = g
    return rec


def at_k(flags: list[bool], k: int) -> bool:
    return any(flags[:k])


def _frac(xs: list[bool]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _geomean(xs: list[float]) -> dict[str, Any] | None:
    return {"value": statistics.geometric_mean(xs), "over": len(xs)} if xs else None


def aggregate(
    records: list[ProblemRecord],
    ks: list[int],
    baselines: list[str],
    target_sol: float = 90.0,
) -> dict[str, Any]:
    """Suite-level metrics; every fraction is over all problems, whatever state they are in."""
    n = len(records)
    measured = [r for r in records if r.state == DONE and not r.compile_only]
    out: dict[str, Any] = {
        "problems": n,
        "states": {
            st: sum(r.state == st for r in records) for st in (DONE, NOT_ATTEMPTED, FAILED, JUDGE_FAILED, PENDING)
        },
        "compile_at": {str(k): _frac([at_k(r.compiled, k) for r in records]) for k in ks},
        # correctness needs the GPU: not measured when every problem ran compile-only
        "correct_at": ({str(k): _frac([at_k(r.correct, k) for r in records]) for k in ks} if measured else None),
        # beside ours, KernelBench's own verdict on the best kernels (allclose to torch, 1e-2)
        "kernelbench_correct": (_frac([bool(r.kernelbench_correct) for r in records]) if measured else None),
        "fast_p": (
            {
                b: {str(p): _frac([r.best_correct and r.speedup.get(b, 0.0) > p for r in records]) for p in FAST_P}
                for b in baselines
            }
            if measured
            else None
        ),
        # KernelBench papers' other headline: the geometric mean over the problems solved
        "geomean_speedup": (
            {b: _geomean([r.speedup[b] for r in records if r.best_correct and r.speedup.get(b)]) for b in baselines}
            if measured
            else None
        ),
    }
    sols = [r.min_pct_sol or 0.0 for r in records]
    out["sol"] = (
        {
            "median_min_pct": statistics.median(sols) if sols else 0.0,
            "mean_min_pct": statistics.fmean(sols) if sols else 0.0,
            "reached_target": sum(s >= target_sol for s in sols),
            "target_pct": target_sol,
        }
        if measured
        else None
    )
    hits = [r.first_hit for r in records if r.first_hit]
    cost: dict[str, Any] = {"reached": len(hits)}
    for key in ("round", "llm_calls", "tokens", "wall_s"):
        vals = [h[key] + (1 if key == "round" else 0) for h in hits if key in h]
        name = "rounds" if key == "round" else key
        cost[name] = {"median": statistics.median(vals), "max": max(vals)} if vals else None
    out["cost_to_target"] = cost
    judged = [t for r in records for t in r.candidate_s]
    gpu_hours = sum(r.gpu_s for r in records if r.state == DONE and not r.compile_only) / 3600.0
    stages: dict[str, float] = {}
    phases: dict[str, float] = {}
    for r in records:
        for k, v in r.stage_s.items():
            stages[k] = round(stages.get(k, 0.0) + v, 2)
        for k, v in r.profile_phases_s.items():
            phases[k] = round(phases.get(k, 0.0) + v, 2)
    starts = [r.gpu_start_s for r in records if r.gpu_start_s is not None]
    out["throughput"] = {
        "candidates": len(judged),
        "gpu_hours": round(gpu_hours, 4),
        "candidates_per_gpu_hour": round(len(judged) / gpu_hours, 1) if gpu_hours else None,
        "median_candidate_s": round(statistics.median(judged), 2) if judged else None,
        "stages_s": stages,
        "profile_phases_s": phases,
        "median_gpu_start_s": statistics.median(starts) if starts else None,
    }
    out["usage"] = {
        "requests": sum(r.usage.get("requests", 0) for r in records),
        "tokens": sum(r.usage.get("prompt_tokens", 0) + r.usage.get("completion_tokens", 0) for r in records),
        "wall_s": sum(r.wall_s for r in records),
    }
    return out
