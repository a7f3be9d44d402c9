"""evals/scripts/step_breakdown.py: the pairing of --phases and the threads' CPU clocks (CPU); on
the GPU every piece, every phase and every cold piece runs, ours and torch's, and the tables have a
row for each."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from evals.scripts import step_breakdown


def test_phases_take_each_difference_within_a_pair() -> None:
    ours = [(1e-6, 5e-6), (3e-6, 9e-6), (2e-6, 7e-6)]
    theirs = [(2e-6, 4e-6), (2e-6, 10e-6), (4e-6, 6e-6)]
    first, second = step_breakdown.paired(ours, theirs)
    # the medians tie (2 and 2 us), but ours was lower in two pairs of three, by 1 us at the median
    assert first == pytest.approx((2.0, 2.0, -1.0, 2))
    assert second == pytest.approx((7.0, 6.0, 1.0, 1))


def test_thread_cpu_tells_each_threads_work_from_its_waiting() -> None:
    started, stop = threading.Event(), threading.Event()
    tid: list[int] = []

    def spin() -> None:
        tid.append(threading.get_native_id())
        started.set()
        while not stop.is_set():
            pass

    worker = threading.Thread(target=spin)
    worker.start()
    started.wait()
    tids = [threading.get_native_id(), tid[0]]
    try:
        main0, other0 = step_breakdown.thread_cpu(tids)
        time.sleep(0.2)  # the main thread waits, the worker works
        main1, other1 = step_breakdown.thread_cpu(tids)
    finally:
        stop.set()
        worker.join()
    assert other1 - other0 > 0.02  # (it shares 2 cores with the rest of the machine)
    assert main1 - main0 < 0.02
    # an ended thread counts nothing rather than failing the step (once the kernel has reaped it)
    for _ in range(100):
        if not Path(f"/proc/self/task/{tid[0]}").exists():
            break
        time.sleep(0.01)
    assert step_breakdown.thread_cpu(tids)[1] == 0


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
    assert len(rows) == 2 * len(step_breakdown.PHASES + step_breakdown.CPU_ROWS), rows
    timed = [r for r in rows if r[2].strip() in step_breakdown.PHASES]
    assert all(float(r[3]) > 0 and float(r[4]) > 0 for r in timed), rows
    main_cpu = [r for r in rows if r[2].strip() == step_breakdown.CPU_ROWS[0]]
    assert len(main_cpu) == 2 and all(float(r[3]) > 0 and float(r[4]) > 0 for r in main_cpu), rows


@pytest.mark.gpu
def test_every_cold_piece_is_timed(capsys: pytest.CaptureFixture[str]) -> None:
    assert step_breakdown.main(["--cold", "--m", "64", "--n", "256", "--samples", "5"]) == 0
    rows = [ln.split("|") for ln in capsys.readouterr().out.splitlines() if ln.startswith("| ") and "piece" not in ln]
    assert len(rows) == 2 * len(step_breakdown.cold_pieces("log_softmax", "float32", 2, 256)), rows
    assert {r[2].strip() for r in rows} == {"warm", "cold"}
    assert all(float(r[3]) > 0 and float(r[4]) > 0 for r in rows), rows
