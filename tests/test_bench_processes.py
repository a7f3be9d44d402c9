"""CPU (CI): `bench --processes`: each child's argv, the spread table from hand-made grids, and a run
whose children are stand-ins (one writes nothing, one is interrupted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmcompile.bench import grid, processes
from llmcompile.cli import main


def _grid(ours: dict[int, float], eager: dict[int, float], interrupted: str = "") -> grid.BenchResult:
    res = grid.BenchResult("H100", 3.0, {"torch": "2.11"}, graph=False, interrupted=interrupted)
    for n, tbs in ours.items():
        res.rows.append(grid.BenchRow("log_softmax", "bfloat16", 32768, n, "llmcompile", 1.0, tbs, 10.0))
    for n, tbs in eager.items():
        res.rows.append(grid.BenchRow("log_softmax", "bfloat16", 32768, n, "eager", 1.0, tbs, 10.0))
    res.rows.append(grid.BenchRow("log_softmax", "bfloat16", 32768, 256, "quack", None, None, None, "no"))
    return res


def test_each_child_runs_the_same_bench_under_its_own_stem() -> None:
    argv = ["bench", "all", "--train", "--processes", "4", "--stem", "small", "--rounds=5", "--processes=4"]
    assert processes.child_argv(argv, "small", 2) == ["bench", "all", "--train", "--rounds=5", "--stem", "small-p2"]
    assert processes.child_argv(["bench", "softmax", "--stem=x"], "x", 1) == ["bench", "softmax", "--stem", "x-p1"]


def test_the_spread_gives_each_points_range_and_median_and_names_those_under_one() -> None:
    runs = [
        _grid({256: 0.9, 512: 1.1}, {256: 1.0, 512: 1.0}),
        _grid({256: 1.2}, {256: 1.0}, "interrupted after 1 points"),
    ]
    runs.append(_grid({256: 0.5, 512: 0.99}, {256: 1.0, 512: 1.1}))
    md = processes.markdown(runs, ["bench", "log_softmax", "--no-graph"])
    assert md.startswith("3 processes of `llmcompile bench log_softmax --no-graph`")
    assert "eager calls" in md and "a process was interrupted" in md
    assert "| log_softmax | bfloat16 | 32768 | 256 | 0.900 | 1.200 | 0.500 | 0.500-1.200 | 0.900 |" in md
    assert "| log_softmax | bfloat16 | 32768 | 512 | 1.100 |  | 0.900 | 0.900-1.100 | 1.000 |" in md
    assert "vs quack" not in md  # (never measured: no table of blanks)
    assert md.rstrip().endswith("Medians under 1.0: log_softmax bfloat16 32768x256 vs eager 0.900")


def test_a_run_keeps_every_table_written_and_says_which_child_wrote_none(tmp_path: Path) -> None:
    seen: list[list[str]] = []
    said: list[str] = []

    def launch(argv: list[str]) -> int:
        seen.append(argv)
        stem = argv[-1]
        if stem.endswith("p2"):
            return 3  # (died before writing)
        if stem.endswith("p3"):  # (a time limit's SIGINT: its partial table is written, then the parent stops)
            (tmp_path / f"{stem}.json").write_text(json.dumps(_grid({256: 2.0}, {256: 1.0}, "interrupted").to_json()))
            raise KeyboardInterrupt
        (tmp_path / f"{stem}.json").write_text(json.dumps(_grid({256: 1.5}, {256: 1.0}).to_json()))
        return 0

    got = processes.run(["bench", "log_softmax", "--processes", "4"], 4, tmp_path, "s", said.append, launch)
    assert [a[-1] for a in seen] == ["s-p1", "s-p2", "s-p3"]  # (the fourth never starts)
    assert len(got) == 2 and "process 2 wrote no table (exit status 3)" in said
    assert any(s.startswith("interrupted in process 3 of 4") for s in said)
    md = (tmp_path / "s-spread.md").read_text()
    assert md.startswith("2 processes of") and "| 1.500 | 2.000 | 1.500-2.000 | 1.750 |" in md
    assert "| op | dtype | M | N | p1 | p3 | range | median |" in md  # (the columns name their processes)


def test_bench_refuses_no_processes_before_it_looks_for_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "softmax", "--processes", "0"]) == 2
    assert "--processes 0: give 1 or more" in capsys.readouterr().err


def test_bench_processes_runs_its_children_through_the_cli(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import llmcompile.cli as cli

    argvs: list[list[str]] = []

    def fake_run(argv, count, out, stem, progress=print, launch=None):  # noqa: ANN001, ANN202
        argvs.append(argv)
        (out / f"{stem}-spread.md").write_text("the spread\n")
        return [_grid({256: 1.0}, {256: 1.0})] * (count - 1)  # (one child wrote nothing)

    monkeypatch.setattr(cli, "require_gpu", lambda target: None)
    monkeypatch.setattr(processes, "run", fake_run)
    rc = main(["bench", "softmax", "--processes", "2", "--out", str(tmp_path), "--stem", "t"])
    assert rc == 1 and "the spread" in capsys.readouterr().out
    assert argvs == [["bench", "softmax", "--processes", "2", "--out", str(tmp_path), "--stem", "t"]]


def test_a_child_that_fails_says_so_through_the_real_launch(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Through a fresh interpreter: the child refuses the op and writes nothing; the parent says so
    and makes no spread."""
    said: list[str] = []
    argv = ["bench", "no_such_op", "--out", str(tmp_path)]
    assert processes.run(argv, 1, tmp_path, "c", said.append) == []
    assert said == ["== process 1 of 1", "process 1 wrote no table (exit status 2)"]
    assert "unknown op 'no_such_op'" in capfd.readouterr().err  # (the child's, on our stderr)
    assert not (tmp_path / "c-spread.md").exists()


def test_an_interrupt_is_passed_to_the_child_once_and_waited_for(tmp_path: Path) -> None:
    """The child runs in a session of its own (a terminal's Ctrl-C reaches the parent alone): the
    parent passes SIGINT on and waits while the child writes what it measured."""
    import os
    import signal
    import sys
    import threading

    mark = tmp_path / "wrote"
    child = (
        "import signal, sys, time\n"
        f"def stop(*a):\n    time.sleep(0.3); open({str(mark)!r}, 'w').write('partial'); sys.exit(0)\n"
        "signal.signal(signal.SIGINT, stop)\n"
        "time.sleep(30)\n"
    )
    # (Python's own handler for the test's length: a shell that starts a job in the background, as
    # CI may, leaves SIGINT ignored, and the parent would never see it)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            processes._launch([], command=(sys.executable, "-c", child))
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, before)
    assert mark.read_text() == "partial"
