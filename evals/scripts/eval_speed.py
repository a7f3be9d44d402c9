"""An eval's judging speed from its folder, the same way for any version of the code: candidates
judged per GPU-hour over the eval's wall time on its GPUs (problems left unfinished count what
they judged), and the median of a candidate's own stage seconds (compile, seal, load, verify,
profile; from its timeline where the verdict has one, else from its stages' `seconds`; a
timeline from before `load` was clocked has none).

    python -m evals.scripts.eval_speed DIR:WALL_S:GPUS [DIR:WALL_S:GPUS ...]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

OWN = ("compile", "seal", "load", "verify", "profile")


def own_seconds(verdict: dict[str, Any]) -> dict[str, float]:
    """A candidate's own stage seconds (what it cost the judge, queueing left out)."""
    tl = verdict.get("timeline") or {}
    if tl:
        return {k: float(tl.get(k, 0.0)) for k in OWN}
    return {k: float((verdict.get(k) or {}).get("seconds", 0.0)) for k in OWN if isinstance(verdict.get(k), dict)}


def speed(folder: Path, wall_s: float, gpus: int) -> dict[str, Any]:
    cands: list[dict[str, float]] = []
    done = 0
    for pdir in sorted((folder / "problems").glob("*")):
        if not pdir.is_dir():
            continue
        done += (pdir / "summary.json").is_file()
        for f in sorted((pdir / "candidates").glob("*.json")):
            cands.append(own_seconds(json.loads(f.read_text())["verdict"]))
    each = [sum(c.values()) for c in cands]
    stages = {k: round(sum(c.get(k, 0.0) for c in cands), 1) for k in OWN}
    gpu_h = wall_s * gpus / 3600.0
    return {
        "folder": str(folder),
        "problems_done": done,
        "candidates": len(cands),
        "wall_s": wall_s,
        "gpus": gpus,
        "candidates_per_gpu_hour": round(len(cands) / gpu_h, 1) if gpu_h else None,
        "median_candidate_s": round(statistics.median(each), 2) if each else None,
        "stages_s": stages,
    }


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    rows = []
    for arg in argv:
        folder, wall, gpus = arg.rsplit(":", 2)
        rows.append(speed(Path(folder), float(wall), int(gpus)))
    print(
        "| eval | problems done | candidates | wall s x GPUs | candidates / GPU-hour | median s / candidate | compile | seal | verify | profile |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        s = r["stages_s"]
        print(
            f"| {r['folder']} | {r['problems_done']} | {r['candidates']} | {r['wall_s']:.0f} x {r['gpus']} | "
            f"{r['candidates_per_gpu_hour']} | {r['median_candidate_s']} | "
            + " | ".join(f"{s.get(k, 0.0):.0f}" for k in OWN)
            + " |"
        )
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
