"""Plots again from the numbers a results folder keeps (its plots are not kept in the tree).

    python -m evals.scripts.replot BENCH.json [OUT.png]     a `llmcompile bench` grid
    python -m evals.scripts.replot EVAL_DIR|RESULTS.json    an eval's results: sol.png, speedup.png beside it

A results folder keeps its JSON as plain files; plots are drawn again from them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from llmcompile.bench import grid
from llmcompile.suites import report


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    src = Path(argv[0])
    data = report.load(src) if src.is_dir() else json.loads(src.read_text())
    if "aggregate" in data:  # an eval's results.json
        where = src if src.is_dir() else src.parent
        report.plot_sol(data, where / "sol.png")
        report.plot_speedup(data, where / "speedup.png")
        print(f"wrote {where / 'sol.png'}, {where / 'speedup.png'}")
        return 0
    out = Path(argv[1]) if len(argv) > 1 else src.with_suffix(".png")
    grid.plot(grid.BenchResult.from_json(data), out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
