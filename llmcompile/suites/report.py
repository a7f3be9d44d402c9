"""What an eval produced, for people and programs: results.json (everything), report.md (the
aggregate, then one row per problem), sol.png and speedup.png; and two evals side by side."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from llmcompile.agent.report import phases_line
from llmcompile.agent.runs import write_json_atomic
from llmcompile.bench.plots import save_png
from llmcompile.suites import metrics as M
from llmcompile.suites.suite import SuiteError

DEFINITIONS = """\
Definitions. compile@k / correct@k: share of problems where one of the first k candidates (in
the order asked: round, then sample) compiled / was verified correct. fast_p: share of all
problems whose best kernel is correct and more than p times faster than the baseline
(geometric mean over the benchmark shapes, timed in the same process on the same inputs).
% SOL: the best kernel's slowest shape, as % of the device copy bandwidth measured beside it.
KB check: KernelBench's own verdict on the best kernel's verified and timed outputs (allclose to
the problem's torch output in its dtype, atol = rtol = 1e-2), beside ours (float64 reference,
tolerance widened by torch's own error on the same inputs).
Cost to target: what was spent when the best first reached the target on every shape.
States: judge_failed is the judge's own failure, not the model's (a rerun runs it again);
every share above is over all problems, so an eval with one left is shown short."""


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}%"


def _num(x: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def build(eval_dir: Path, records: list[M.ProblemRecord]) -> dict[str, Any]:
    head = json.loads((eval_dir / "eval.json").read_text())
    suite, opts = head["suite"], head["options"]
    samples = opts.get("samples") or max((p["budget"]["samples"] for p in suite["problems"]), default=1)
    rounds = opts.get("rounds") or max((p["budget"]["rounds"] for p in suite["problems"]), default=1)
    ks = sorted({1, samples, samples * rounds})
    target = max((p["budget"]["target_sol"] for p in suite["problems"]), default=90.0)
    baselines = [b for b in ("eager", "compile") if b in suite["baselines"]]
    agg = M.aggregate(records, ks, baselines, target)
    probs = sorted((asdict(r) for r in records), key=lambda p: _natural(p["id"]))
    return {"eval": head, "ks": ks, "aggregate": agg, "problems": probs}


def _natural(pid: str) -> tuple[int, str]:
    """KernelBench's numbered files in their numbers' order (4 before 12 before 100), others after."""
    head = pid.split("_", 1)[0]
    return (int(head), pid) if head.isdigit() else (1 << 30, pid)


def write(eval_dir: Path, records: list[M.ProblemRecord]) -> dict[str, Path]:
    res = build(eval_dir, records)
    paths = {k: eval_dir / n for k, n in (("json", "results.json"), ("md", "report.md"))}
    write_json_atomic(paths["json"], res)
    paths["md"].write_text(markdown(res))
    paths["sol"] = eval_dir / "sol.png"
    paths["speedup"] = eval_dir / "speedup.png"
    plot_sol(res, paths["sol"])
    plot_speedup(res, paths["speedup"])
    return paths


def load(eval_dir: Path) -> dict[str, Any]:
    p = eval_dir / "results.json"
    if not p.is_file():
        raise SuiteError(f"{eval_dir}: no results.json (not an eval directory, or it has not reported yet)")
    return json.loads(p.read_text())


def aggregate_table(res: dict[str, Any]) -> list[tuple[str, str]]:
    a = res["aggregate"]
    rows = [("problems", str(a["problems"]))]
    rows.append(("states", ", ".join(f"{k} {v}" for k, v in a["states"].items() if v)))
    for k, v in a["compile_at"].items():
        rows.append((f"compile@{k}", _pct(v)))
    for k in a["compile_at"]:
        rows.append((f"correct@{k}", _pct(a["correct_at"][k]) if a["correct_at"] else "not measured (compile-only)"))
    if a.get("kernelbench_correct") is not None:
        rows.append(("correct by KernelBench's check (best kernel)", _pct(a["kernelbench_correct"])))
    for b, ps in (a["fast_p"] or {}).items():
        for p, v in ps.items():
            rows.append((f"fast_{float(p):g} vs {b}", _pct(v)))
    for b, g in (a.get("geomean_speedup") or {}).items():
        rows.append((f"geomean speedup vs {b} (correct problems)", f"{g['value']:.2f}x over {g['over']}" if g else "-"))
    if a["sol"]:
        s = a["sol"]
        rows.append(("median % SOL (slowest shape)", f"{s['median_min_pct']:.1f}"))
        rows.append((f"problems >= {s['target_pct']:.0f}% SOL", f"{s['reached_target']} of {a['problems']}"))
    c = a["cost_to_target"]
    rows.append(("reached the target", str(c["reached"])))
    for key, label in (("rounds", "rounds"), ("llm_calls", "LLM calls"), ("tokens", "tokens"), ("wall_s", "wall s")):
        if c.get(key):
            rows.append((f"cost to target: {label} (median / max)", f"{c[key]['median']:.0f} / {c[key]['max']:.0f}"))
    u = a["usage"]
    rows.append(("total LLM calls / tokens / agent wall s", f"{u['requests']} / {u['tokens']} / {u['wall_s']:.0f}"))
    t = a.get("throughput") or {}
    if t.get("candidates"):
        per_hour = t.get("candidates_per_gpu_hour")
        rows.append(("candidates judged / GPU-hours", f"{t['candidates']} / {t['gpu_hours']:.3f}"))
        rows.append(("candidates per GPU-hour", "-" if per_hour is None else f"{per_hour:.0f}"))
        rows.append(("median judge seconds per candidate (its own stages)", _num(t.get("median_candidate_s"))))
        stages = t.get("stages_s") or {}
        rows.append(("seconds by stage, summed", ", ".join(f"{k} {v:.0f}" for k, v in stages.items() if v)))
        if phases := t.get("profile_phases_s"):
            rows.append(("the profile's seconds by phase, summed", phases_line(phases)))
        if t.get("median_gpu_start_s") is not None:
            rows.append(
                ("a run's GPU worker up and warm, median s from its start or GPU turn", _num(t["median_gpu_start_s"]))
            )
    return rows


def markdown(res: dict[str, Any]) -> str:
    ev = res["eval"]
    suite, opts = ev["suite"], ev["options"]
    llm = opts["llm"] + (f" ({opts['model']})" if opts.get("model") else "")
    out = [
        f"# Eval: {suite['name']} on {suite['target']} with {llm}",
        "",
        f"Started {ev.get('started', '?')}; torch {ev.get('torch', '?')}, CuTe DSL {ev.get('cutlass', '?')}, "
        f"GPU {ev.get('gpu') or 'none'}."
        + (" Compile-only: nothing was run on a GPU." if opts["compile_only"] else ""),
        ""
        if opts["llm"] != "offline"
        else "No LLM was used (offline default): built-in ops get the reference kernels' knob search, custom "
        "ops the pattern template their torch graph matches.",
        "",
        "| metric | value |",
        "|---|---|",
    ]
    out += [f"| {k} | {v} |" for k, v in aggregate_table(res)]
    ks = res["ks"]
    out += [
        "",
        "| problem | state | candidates | compiled@" + "/".join(map(str, ks)) + " | correct@" + "/".join(map(str, ks))
        + " | best | KB check | % SOL min / mean | x eager | x compile | to target: rounds / calls / tokens / s |",
        "|---" * 11 + "|",
    ]  # fmt: skip
    for p in res["problems"]:
        comp = "/".join("y" if any(p["compiled"][:k]) else "n" for k in ks)
        corr = "/".join("y" if any(p["correct"][:k]) else "n" for k in ks) if not p["compile_only"] else "n/a"
        hit = p["first_hit"]
        cost = (
            f"{hit['round'] + 1} / {hit['llm_calls']} / {hit['tokens']} / {hit['wall_s']:.0f}" if hit else "not reached"
        )
        sol = f"{_num(p['min_pct_sol'])} / {_num(p['mean_pct_sol'])}" if p["min_pct_sol"] is not None else "-"
        state = p["state"] + (f" (GPU {p['gpu']})" if p.get("gpu") is not None else "")
        state += f": {p['reason']}" if p["reason"] else ""
        kb = {True: "pass", False: "FAIL", None: "-"}[p.get("kernelbench_correct")]
        out.append(
            f"| {p['id']} | {state} | {len(p['statuses'])} | {comp} | {corr} | {p['best_status'] or '-'} | {kb} | {sol} | "
            f"{_num(p['speedup'].get('eager'), '{:.2f}')} | {_num(p['speedup'].get('compile'), '{:.2f}')} | {cost} |"
        )
    out += ["", DEFINITIONS, ""]
    return "\n".join(out)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_sol(res: dict[str, Any], path: Path) -> None:
    plt = _plt()
    probs = res["problems"]
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(probs) + 1.5))
    ys = range(len(probs))
    vals = [p["min_pct_sol"] or 0.0 for p in probs]
    target = res["aggregate"]["sol"]["target_pct"] if res["aggregate"]["sol"] else 90.0
    colors = [
        "lightgray" if p["min_pct_sol"] is None else "tab:green" if p["min_pct_sol"] >= target else "tab:orange"
        for p in probs
    ]
    ax.barh(list(ys), vals, color=colors)
    for y, p in zip(ys, probs):
        if p["min_pct_sol"] is None:
            ax.text(1, y, p["state"] if p["state"] != "done" else (p["best_status"] or "no kernel"), va="center",
                    fontsize=7)  # fmt: skip
    ax.axvline(target, color="k", linestyle="--", linewidth=1, label=f"target {target:.0f}%")
    ax.set_yticks(list(ys), [p["id"] for p in probs], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("% of device copy bandwidth, slowest benchmark shape")
    ax.set_xlim(0, max(110, max(vals, default=0) + 5))
    ax.legend(fontsize=7)
    ax.set_title(f"{res['eval']['suite']['name']}: best kernel per problem ({res['eval']['options']['llm']})")
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)


def plot_speedup(res: dict[str, Any], path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.8))
    drawn = False
    for i, b in enumerate(("eager", "compile")):
        pts = sorted(p["speedup"][b] for p in res["problems"] if b in p["speedup"])
        if pts:
            drawn = True
            ax.plot(range(1, len(pts) + 1), pts, marker="o", linestyle="-", label=f"vs {b}", color=f"C{i}")
    for p in M.FAST_P:
        ax.axhline(p, color="gray", linestyle=":", linewidth=1)
    ax.set_yscale("log")
    ax.set_xlabel("problems with a correct kernel, sorted")
    ax.set_ylabel("speedup (geomean over shapes)")
    ax.set_title("Speedup distribution (dotted: p = 1, 1.5, 2)")
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no correct, timed kernel", transform=ax.transAxes, ha="center")
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)


def compare(a_dir: Path, b_dir: Path) -> str:
    a, b = load(a_dir), load(b_dir)
    name = [f"A: {a_dir}", f"B: {b_dir}"]
    out = [f"# {name[0]} vs {name[1]}", "", "| metric | A | B |", "|---|---|---|"]
    ra, rb = dict(aggregate_table(a)), dict(aggregate_table(b))
    for k in dict.fromkeys(list(ra) + list(rb)):
        out.append(f"| {k} | {ra.get(k, '-')} | {rb.get(k, '-')} |")
    pa = {p["id"]: p for p in a["problems"]}
    pb = {p["id"]: p for p in b["problems"]}
    out += [
        "",
        "| problem | A % SOL | B % SOL | A x eager | B x eager | A x compile | B x compile | A to target s | B to target s |",
        "|---" * 9 + "|",
    ]

    def cells(p: dict[str, Any] | None) -> tuple[str, str, str, str]:
        if p is None:
            return ("absent",) * 4
        hit = p["first_hit"]
        return (
            _num(p["min_pct_sol"]) if p["min_pct_sol"] is not None else p["best_status"] or p["state"],
            _num(p["speedup"].get("eager"), "{:.2f}"),
            _num(p["speedup"].get("compile"), "{:.2f}"),
            f"{hit['wall_s']:.0f}" if hit else "-",
        )

    for pid in dict.fromkeys(list(pa) + list(pb)):
        ca, cb = cells(pa.get(pid)), cells(pb.get(pid))
        out.append(f"| {pid} | " + " | ".join(f"{x} | {y}" for x, y in zip(ca, cb)) + " |")
    return "\n".join(out) + "\n"
