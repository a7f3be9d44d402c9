"""evals/scripts/step_breakdown.py: the pairing of --phases (CPU); on the GPU every piece and every
phase runs, ours and torch's, and the tables have a row for each."""

from __future__ import annotations

import pytest

from evals.scripts import step_breakdown


def test_phases_take_each_difference_within_a_pair() -> None:
    ours = [(1e-6, 5e-6), (3e-6, 9e-6), (2e-6, 7e-6)]
    theirs = [(2e-6, 4e-6), (2e-6, 10e-6), (4e-6, 6e-6)]
    first, second = step_breakdown.paired(ours, theirs)
    # the medians tie (2 and 2 us), but ours was lower in two pairs of three, by 1 us at the median
    assert first == pytest.approx((2.0, 2.0, -1.0, 2))
    assert second == pytest.approx((7.0, 6.0, 1.0, 1))


@pytest.mark.gpu
def test_every_piece_is_timed(capsys: pytest.CaptureFixture[str]) -> None:
    assert step_breakdown.main(["--n", "256", "--calls", "5", "--repeats", "3"]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| ") and "piece" not in ln]
    assert len(rows) == 8 and all(float(r.split("|")[-2]) > 0 for r in rows), rows


@pytest.mark.gpu
def test_every_phase_is_timed(capsys: pytest.CaptureFixture[str]) -> None:
    assert step_breakdown.main(["--phases", "--m", "64", "--n", "256", "--samples", "5"]) == 0
    rows = [
        ln.split("|")
        for ln in capsys.readouterr().out.splitlines()
        if ln.startswith("| idle") or ln.startswith("| busy")
    ]
    assert len(rows) == 2 * len(step_breakdown.PHASES), rows
    assert all(float(r[3]) > 0 and float(r[4]) > 0 for r in rows), rows
