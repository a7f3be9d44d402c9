"""The run's closing table (llmcompile/report.py)."""

from __future__ import annotations

from llmcompile.report import summary_table


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
    assert "| M x N | TFLOP/s | % SOL | fa4 |" in table and "TB/s" not in table
    assert "| 128 x 2048 | 480.600 | 63.9 | 539.20 |" in table


def test_a_summary_from_before_the_unit_was_recorded_reads_as_bandwidth() -> None:
    assert "| M x N | TB/s | % SOL | fa4 |" in summary_table(_summary(None))
