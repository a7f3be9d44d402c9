"""The eval report from records alone (no agent run): problem order, the geomean rows, the plot."""

from __future__ import annotations

import json
from pathlib import Path

from llmcompile.suites import metrics as M
from llmcompile.suites import report


def _record(pid: str, pct: float, compile_x: float) -> M.ProblemRecord:
    return M.ProblemRecord(
        pid, pid, "float32", state=M.DONE, compiled=[True], correct=[True], best_status="profiled",
        speedup={"eager": 2.0, "compile": compile_x}, min_pct_sol=pct, mean_pct_sol=pct,
    )  # fmt: skip


def test_report_orders_numbered_problems_by_number_and_gives_the_geomeans(tmp_path: Path) -> None:
    head = {
        "suite": {"name": "kb", "target": "h100", "baselines": ["eager", "compile"],
                  "problems": [{"budget": {"samples": 1, "rounds": 1, "target_sol": 90.0}}]},
        "options": {"llm": "offline", "compile_only": False, "samples": 1, "rounds": 1},
    }  # fmt: skip
    (tmp_path / "eval.json").write_text(json.dumps(head))
    ids = ["100_HingeLoss-fp32", "12_Matmul-fp32", "4_GEMV-fp32", "softmax-bf16", "5_Scale-fp32"]
    recs = [_record(pid, pct, x) for pid, pct, x in zip(ids, (102.0, 97.0, 66.9, 99.0, 101.0), (1, 4, 1, 1, 0.25))]
    paths = report.write(tmp_path, recs)
    res = report.load(tmp_path)
    assert [p["id"] for p in res["problems"]] == [
        "4_GEMV-fp32", "5_Scale-fp32", "12_Matmul-fp32", "100_HingeLoss-fp32", "softmax-bf16",
    ]  # fmt: skip
    md = paths["md"].read_text()
    assert "| geomean speedup vs eager (correct problems) | 2.00x over 5 |" in md
    assert "| geomean speedup vs compile (correct problems) | 1.00x over 5 |" in md  # (4 * 0.25)^(1/5)
    assert md.index("| 4_GEMV-fp32 |") < md.index("| 12_Matmul-fp32 |") < md.index("| 100_HingeLoss-fp32 |")
    assert "| problems >= 90% SOL | 4 of 5 |" in md
    assert paths["sol"].stat().st_size > 0
