"""The local pool and Ray side by side, from what `.ci/gpu ray-smoke` / `ray-kb` left in a folder:
wall time, whether every problem ended the same, candidates per GPU-hour, GPU utilisation, and
the scaling efficiency (Ray's throughput over that of the local pool times the ratio of GPUs).

    python -m evals.scripts.scaling OUT_DIR smoke|kb
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from pathlib import Path
from typing import Any


def _load(out: Path, name: str) -> dict[str, Any] | None:
    p = out / f"{name}.json"
    return json.loads(p.read_text()) if p.is_file() else None


def _wall(out: Path, name: str) -> float | None:
    text = (out / "ray.txt").read_text() if (out / "ray.txt").is_file() else ""
    for line in text.splitlines():
        if line.startswith(f"{name}: wall "):
            return float(line.split("wall ")[1].split()[0])
    return None


def _util(out: Path, name: str) -> dict[int, float]:
    """Mean utilisation of each GPU over the run, from nvidia-smi's samples."""
    p = out / f"util-{name}.csv"
    by_gpu: dict[int, list[float]] = {}
    if p.is_file():
        for row in csv.reader(p.read_text().splitlines()):
            try:
                by_gpu.setdefault(int(row[0]), []).append(float(row[1]))
            except (ValueError, IndexError):
                continue
    return {g: statistics.fmean(v) for g, v in sorted(by_gpu.items()) if v}


def _outcomes(res: dict[str, Any]) -> dict[str, tuple[str, str | None]]:
    return {p["id"]: (p["state"], p.get("best_status")) for p in res["problems"]}


def table(out: Path, kind: str) -> str:
    names = sorted(p.stem for p in out.glob(f"{kind}-*.json") if not p.stem.endswith("-outcomes"))
    rows = []
    runs = {}
    for name in names:
        res = _load(out, name)
        wall = _wall(out, name)
        if res is None or wall is None:
            continue
        gpus = len(_util(out, name)) if name.endswith("-all") else int(name.rsplit("-", 1)[1])
        t = res["aggregate"].get("throughput") or {}
        cands = t.get("candidates", 0)
        util = _util(out, name)
        used = {g: u for g, u in util.items()} if name.endswith("-all") else {g: u for g, u in util.items() if g < gpus}
        runs[name] = (res, wall, gpus, cands)
        rows.append(
            f"| {name} | {gpus} | {wall:.0f} | {cands} | {3600 * cands / (wall * gpus):.0f} | "
            f"{t.get('median_candidate_s') or 0:.1f} | "
            + ", ".join(f"GPU{g} {u:.0f}%" for g, u in used.items())
            + f" | {res['aggregate']['states']} |"
        )
    head = [
        f"| {kind} run | GPUs | wall s | candidates | candidates per GPU-hour | median judge s / candidate | "
        "GPU utilisation (mean) | outcomes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines = head + rows
    local = next((v for k, v in runs.items() if "-local-" in k), None)
    ray = next((v for k, v in runs.items() if "-ray-" in k), None)
    if local and ray:
        same = _outcomes(local[0]) == _outcomes(ray[0])
        lines.append("")
        lines.append(f"Every problem ended the same on both: {same}.")
        if not same:
            a, b = _outcomes(local[0]), _outcomes(ray[0])
            lines.append(
                "Differences: "
                + "; ".join(f"{k}: {a.get(k)} vs {b.get(k)}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))
            )
        (_, lw, lg, lc), (_, rw, rg, rc) = local, ray
        if lc and rc:
            eff = (rc / rw) / ((lc / lw) * rg / lg)
            lines.append(
                f"Scaling efficiency: {eff:.2f} (Ray's {rc / rw * 3600:.0f} candidates an hour on {rg} GPUs over "
                f"{rg / lg:.0f}x the local pool's {lc / lw * 3600:.0f} on {lg})."
            )
    kill = out / "ray-kill.txt"
    if kill.is_file():
        lines.append("")
        lines.append("Lost worker: " + kill.read_text().strip())
    return "\n".join(lines)


def main() -> None:
    out, kind = Path(sys.argv[1]), sys.argv[2]
    text = table(out, kind)
    (out / f"scaling-{kind}.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
