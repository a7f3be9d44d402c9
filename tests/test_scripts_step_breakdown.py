"""evals/scripts/step_breakdown.py on the GPU: every piece runs, ours and torch's, and the table has
a row for each."""

from __future__ import annotations

import pytest

from evals.scripts import step_breakdown


@pytest.mark.gpu
def test_every_piece_is_timed(capsys: pytest.CaptureFixture[str]) -> None:
    assert step_breakdown.main(["--n", "256", "--calls", "5", "--repeats", "3"]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| ") and "piece" not in ln]
    assert len(rows) == 8 and all(float(r.split("|")[-2]) > 0 for r in rows), rows
