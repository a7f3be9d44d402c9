"""The end of a run: best/ (importable kernel, report.md, plot.png) and a short summary."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from llmcompile.agent.loop import RunResult
from llmcompile.agent.runs import RunConfig, RunStore
from llmcompile.bench import grid
from llmcompile.harness import Judge, JudgeOptions, profiled_message
from llmcompile.harness.verdict import Verdict
from llmcompile.specs import OpSpec


def bench_result_of(v: Verdict, spec: OpSpec, dtype: str) -> grid.BenchResult | None:
    """A profile verdict (ours + baselines per shape) as a benchmark result, for tables and plots."""
    p = v.profile
    if not p:
        return None
    res = grid.BenchResult(v.target, p.sol_tbs, grid.versions(), copies={"device copy": p.sol_tbs}, read_tbs=p.read_tbs)
    if p.unit != "TB/s":  # (its SOL is the GEMM probe, no copy was measured)
        res.copies, res.compute = {}, {dtype: p.sol_tbs}
    for s in p.shapes:
        res.rows.append(grid.BenchRow(spec.name, dtype, s.m, s.n, "llmcompile", s.ms, s.tbs, s.pct_sol, "", p.unit))
        for impl, tbs in s.baselines.items():
            ms = s.baseline_ms.get(impl)
            note = s.baseline_notes.get(impl, "")
            res.rows.append(
                grid.BenchRow(spec.name, dtype, s.m, s.n, impl, ms, tbs, 100 * tbs / p.sol_tbs, note, p.unit)
            )
    return res


STAGES = ("compile", "seal", "gpu_wait", "load", "verify", "profile", "attribute")


def timeline_of(store: RunStore, target_pct: float, started: float | None = None) -> dict[str, Any]:
    """Where a run's time went, from its events: start-up (the process's start to its first
    question to the provider), the first verdict, the first kernel at the target % of SOL, the
    rounds, the end (the best timed beside the baselines, best/ written); and each judge stage
    summed over the candidates (their verdicts' timelines)."""
    events = store.events()
    starts = [e for e in events if e["event"] == "start"]
    t0 = started or (starts[-1].get("at", starts[-1]["t"]) if starts else (events[0]["t"] if events else 0.0))
    mine = [e for e in events if e["t"] >= t0]
    first = {
        name: next((e for e in mine if e["event"] == name), None)
        for name in ("round", "judged", "stop", "end", "judge")
    }
    gpu = first["judge"] or {}
    judged = [e for e in mine if e["event"] == "judged"]
    hits = [e.get("finished_at") or e["t"] for e in judged if e.get("min_pct") and e["min_pct"][0] >= target_pct]
    done = [e.get("finished_at") or e["t"] for e in judged]

    def since(t: float | None) -> float | None:
        return round(t - t0, 2) if t is not None else None

    stages = {k: round(sum(e.get("stages", {}).get(k, 0.0) for e in judged), 2) for k in STAGES}
    phases: dict[str, float] = {}  # the profile's seconds by phase (gpu_stages.profile_candidate)
    for e in judged:
        for k, v in e.get("stages", {}).items():
            if k.startswith("profile."):
                name = k.removeprefix("profile.")
                phases[name] = round(phases.get(name, 0.0) + v, 2)
    base = next((e for e in mine if e["event"] == "baselines"), None)
    if base is not None:
        stages["baselines"] = round(base.get("seconds", 0.0), 2)
    return {
        "startup_s": since(first["round"]["t"]) if first["round"] else None,
        "gpu_turn_s": since(gpu.get("gpu_turn")),
        "gpu_lent_s": gpu.get("gpu_lent_s"),
        "gpu_ready_s": since(gpu.get("gpu_ready")),
        "gpu_warmed_s": since(gpu.get("gpu_warmed")),
        "first_verdict_s": since(min(done)) if done else None,
        "to_target_s": since(min(hits)) if hits else None,
        "rounds_s": round(first["stop"]["t"] - first["round"]["t"], 2) if first["stop"] and first["round"] else None,
        "finalize_s": round(first["end"]["t"] - first["stop"]["t"], 2) if first["end"] and first["stop"] else None,
        "total_s": since(first["end"]["t"]) if first["end"] else None,
        "candidates": len(judged),
        "stages": stages,
        "profile_phases": phases,
    }


def timeline_table(tl: dict[str, Any]) -> str:
    """The timeline as a few lines of markdown (report.md, the eval's report)."""
    # (label, seconds, shown only when set: a run alone on its GPU took no turn, one without an LLM lent none)
    rows = [
        ("start-up (process start to the first round)", tl.get("startup_s"), False),
        ("the GPU this run's (its turn on a GPU other runs shared)", tl.get("gpu_turn_s"), True),
        ("the GPU worker ready (its imports, a CUDA context)", tl.get("gpu_ready_s"), False),
        ("the GPU worker's start done (the device's bandwidth measured)", tl.get("gpu_warmed_s"), False),
        ("first verdict", tl.get("first_verdict_s"), False),
        ("first kernel at the target % of SOL", tl.get("to_target_s"), False),
        ("rounds", tl.get("rounds_s"), False),
        ("of them, the GPU lent to other runs while the LLM answered", tl.get("gpu_lent_s"), True),
        ("the end (best beside the baselines, best/ written)", tl.get("finalize_s"), False),
        ("total", tl.get("total_s"), False),
    ]
    shown = [(k, v) for k, v, only_set in rows if v is not None or not only_set]
    out = ["| when | seconds |", "|---|---|"] + [f"| {k} | {'-' if v is None else f'{v:.1f}'} |" for k, v in shown]
    stages = tl.get("stages", {})
    out += [
        "",
        f"Judge stages summed over {tl.get('candidates', 0)} candidates (compile and seal run in parallel):",
        "",
    ]
    out += [
        "| " + " | ".join(stages) + " |",
        "|---" * len(stages) + "|",
        "| " + " | ".join(f"{v:.1f}" for v in stages.values()) + " |",
    ]
    if phases := tl.get("profile_phases"):
        out += ["", f"The profile by phase: {phases_line(phases)}."]
    return "\n".join(out)


def phases_line(phases: dict[str, float]) -> str:
    """The profile's seconds by phase, largest first ("candidate 1.2, eager 0.8, ...")."""
    return ", ".join(f"{k} {v:.1f}" for k, v in sorted(phases.items(), key=lambda kv: -kv[1]) if v >= 0.05)


def finalize(store: RunStore, spec: OpSpec, cfg: RunConfig, result: RunResult, judge: Judge) -> dict[str, Any]:
    store.event("finalize")
    summary: dict[str, Any] = {
        "op": spec.name,
        "dtype": cfg.dtype,
        "target": cfg.target,
        "provider": cfg.provider,
        "llm_used": cfg.provider == "openai",
        "stop_reason": result.stop_reason,
        "rounds": result.rounds,
        "judged": result.judged,
        "verdicts": result.verdicts,
        "usage": asdict(result.usage),
        "wall_s": result.wall_s,
        "first_hit": result.first_hit,
        "best": None,
    }
    b = result.best
    if b is not None:
        final = b.verdict
        timed_beside = bool(b.verdict.profile and any(sh.baselines for sh in b.verdict.profile.shapes))
        if b.verdict.profile and cfg.baselines and not cfg.compile_only and not timed_beside:
            # the best again, beside the baselines, in one process on the same inputs (baselines
            # timed on this machine before come from the judge's cache, with their age)
            tb = time.perf_counter()
            again = judge.evaluate(
                b.source,
                spec,
                cfg.dtype,
                JudgeOptions(
                    stages=("static", "compile", "profile"),
                    baselines=cfg.baselines,
                    profile_shapes=cfg.profile_shapes(),
                ),
            )
            cached = sorted({b for sh in (again.profile.shapes if again.profile else []) for b in sh.baseline_age_s})
            store.event("baselines", seconds=time.perf_counter() - tb, cached=cached)
            if again.passed:
                # the verification it passed when judged, not this profile-only rerun's none
                again.verify = b.verdict.verify
                if again.profile:
                    again.message = profiled_message(again)
                final = again
        judge.release_gpu()  # (what is left writes files: the GPU is the next run's)
        artifact = final.artifact
        if artifact is None or not Path(artifact).is_dir():  # a verdict from an earlier process
            opts = JudgeOptions(stages=("static", "compile"), profile_shapes=cfg.profile_shapes())
            artifact = judge.evaluate(b.source, spec, cfg.dtype, opts).artifact
        meta = {"op_ref": spec.ref, "op": spec.name, "dtype": cfg.dtype, "target": cfg.target, "candidate": b.id}
        meta["verdict"] = final.to_json()
        best_dir = store.write_best(spec.name, b.source, meta, artifact)
        table = ""
        res = bench_result_of(final, spec, cfg.dtype)
        if res is not None:
            table = grid.markdown(res)
            grid.plot(res, best_dir / "plot.png")
            (best_dir / "bench.json").write_text(json.dumps(res.to_json(), indent=1))
        store.event("end")
        summary["timeline"] = timeline_of(store, cfg.target_pct)
        (best_dir / "report.md").write_text(
            f"# {spec.name} ({cfg.dtype}) on {cfg.target}: best candidate {b.id}\n\n"
            f"Provider: {cfg.provider}{' (no LLM was used)' if cfg.provider != 'openai' else ''}. "
            f"Stopped: {result.stop_reason}. {result.judged} candidates judged in {result.wall_s:.0f} s.\n\n"
            f"Verdict: {final.status}: {final.message}\n\n{table}{_ages(final)}\n\n"
            f"## Where the time went\n\n{timeline_table(summary['timeline'])}\n"
        )
        summary["best"] = {
            "id": b.id,
            "status": final.status,
            "min_pct_sol": b.min_pct,
            "mean_pct_sol": b.mean_pct,
            "shapes": [asdict(s) for s in final.profile.shapes] if final.profile else [],
            "unit": final.profile.unit if final.profile else "TB/s",
            "dir": str(best_dir),
        }
    if "timeline" not in summary:
        store.event("end")
        summary["timeline"] = timeline_of(store, cfg.target_pct)
    store.write_json("summary.json", summary)
    return summary


def _ages(v: Verdict) -> str:
    """Lines naming the baselines taken from the judge's cache, and how old they are; and those
    timed while the GPU was not the judge's alone (not cached)."""
    ages: dict[str, float] = {}
    for sh in v.profile.shapes if v.profile else []:
        for b, age in sh.baseline_age_s.items():
            ages[b] = max(ages.get(b, 0.0), age)
    out = ""
    if ages:
        said = ", ".join(f"{b} ({_age(a)} ago)" for b, a in sorted(ages.items()))
        out = f"\n\nTimed earlier on this machine by the same software, taken from the judge's baseline cache: {said}."
    if v.profile and v.profile.disturbed:
        out += (
            "\n\nThe baselines timed here may be slow: right after them the GPU was not the judge's alone "
            f"({v.profile.disturbed}); they were not kept in the baseline cache."
        )
    return out


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def summary_table(summary: dict[str, Any]) -> str:
    lines = [
        f"{summary['op']} ({summary['dtype']}) on {summary['target']} with {summary['provider']}"
        + ("" if summary["llm_used"] else " (no LLM was used)"),
        f"stopped: {summary['stop_reason']}; {summary['judged']} candidates in {summary['wall_s']:.0f} s; "
        f"verdicts: {', '.join(f'{k} {v}' for k, v in sorted(summary['verdicts'].items()))}",
    ]
    best = summary.get("best")
    if not best:
        lines.append("no candidate passed")
        return "\n".join(lines)
    if best["status"] == "compiled":
        lines.append(f"best: {best['id']} (compiled only: not verified or timed)")
    else:
        lines.append(f"best: {best['id']} ({best['status']}), slowest shape {best['min_pct_sol']:.1f}% of SOL")
    if best["shapes"]:
        impls = sorted({k for s in best["shapes"] for k in s["baselines"]})
        unit = best.get("unit", "TB/s")  # (TFLOP/s for a compute-bound op)
        # (each baseline's own rate in the same unit, not a speedup: the header says so)
        lines.append(f"| M x N | {unit} | % SOL | " + " | ".join(f"{i} {unit}" for i in impls) + " |")
        lines.append("|---" * (3 + len(impls)) + "|")
        for s in best["shapes"]:
            cells = " | ".join(f"{s['baselines'][i]:.2f}" if i in s["baselines"] else "n/a" for i in impls)
            lines.append(f"| {s['m']} x {s['n']} | {s['tbs']:.3f} | {s['pct_sol']:.1f} | {cells} |")
    lines.append(f"kernel: {best['dir']}")
    tl = summary.get("timeline") or {}
    if tl.get("total_s") is not None:
        hit = tl.get("to_target_s")
        lines.append(
            f"time: {tl['total_s']:.0f} s in all"
            + (f"; the first kernel at the target % of SOL after {hit:.0f} s" if hit is not None else "")
            + f" (start-up {tl.get('startup_s') or 0:.0f} s; details in {best['dir']}/report.md)"
        )
    return "\n".join(lines)
