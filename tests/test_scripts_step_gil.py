"""evals/scripts/step_gil.py on the GPU: every step form runs, and the table has a row for each."""

from __future__ import annotations

import pytest

from evals.scripts import step_gil


@pytest.mark.gpu
def test_every_step_form_is_timed(capsys: pytest.CaptureFixture[str]) -> None:
    assert step_gil.main(["--rows", "8", "--repeats", "2"]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| 8 |")]
    assert len(rows) == 4 and all(float(r.split("|")[3]) > 0 for r in rows), rows
