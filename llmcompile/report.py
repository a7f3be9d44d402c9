"""The end of a run: best/ (importable kernel, report.md, plot.png) and a short summary."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from llmcompile import bench
from llmcompile.agent import RunResult
from llmcompile.harness import Judge, JudgeOptions, profiled_message
from llmcompile.harness.verdict import Verdict
from llmcompile.ops import OpSpec
from llmcompile.runs import RunConfig, RunStore


def bench_result_of(v: Verdict, spec: OpSpec, dtype: str) -> bench.BenchResult | None:
    """A profile verdict (ours + baselines per shape) as a benchmark result, for tables and plots."""
    p = v.profile
    if not p:
        return None
    res = bench.BenchResult(
        v.target, p.sol_tbs, bench.versions(), copies={"device copy": p.sol_tbs}, read_tbs=p.read_tbs
    )
    if p.unit != "TB/s":  # (its SOL is the GEMM probe, no copy was measured)
        res.copies, res.compute = {}, {dtype: p.sol_tbs}
    for s in p.shapes:
        res.rows.append(bench.BenchRow(spec.name, dtype, s.m, s.n, "llmcompile", s.ms, s.tbs, s.pct_sol, "", p.unit))
        for impl, tbs in s.baselines.items():
            ms = s.baseline_ms.get(impl)
            res.rows.append(
                bench.BenchRow(spec.name, dtype, s.m, s.n, impl, ms, tbs, 100 * tbs / p.sol_tbs, "", p.unit)
            )
    return res


def finalize(store: RunStore, spec: OpSpec, cfg: RunConfig, result: RunResult, judge: Judge) -> dict[str, Any]:
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
            # the best again, beside the baselines, in one process on the same inputs
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
            if again.passed:
                # the verification it passed when judged, not this profile-only rerun's none
                again.verify = b.verdict.verify
                if again.profile:
                    again.message = profiled_message(again)
                final = again
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
            table = bench.markdown(res)
            bench.plot(res, best_dir / "plot.png")
            (best_dir / "bench.json").write_text(json.dumps(res.to_json(), indent=1))
        (best_dir / "report.md").write_text(
            f"# {spec.name} ({cfg.dtype}) on {cfg.target}: best candidate {b.id}\n\n"
            f"Provider: {cfg.provider}{' (no LLM was used)' if cfg.provider != 'openai' else ''}. "
            f"Stopped: {result.stop_reason}. {result.judged} candidates judged in {result.wall_s:.0f} s.\n\n"
            f"Verdict: {final.status}: {final.message}\n\n{table}"
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
    store.write_json("summary.json", summary)
    return summary


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
        lines.append(f"| M x N | {unit} | % SOL | " + " | ".join(impls) + " |")
        lines.append("|---" * (3 + len(impls)) + "|")
        for s in best["shapes"]:
            cells = " | ".join(f"{s['baselines'][i]:.2f}" if i in s["baselines"] else "n/a" for i in impls)
            lines.append(f"| {s['m']} x {s['n']} | {s['tbs']:.3f} | {s['pct_sol']:.1f} | {cells} |")
    lines.append(f"kernel: {best['dir']}")
    return "\n".join(lines)
