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
    both = ["bench", "softmax", "--before", "old", "--processes", "2", "--before=old"]
    assert processes.child_argv(both, "x-before", 1) == ["bench", "softmax", "--stem", "x-before-p1"]


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

    def launch(argv: list[str], tree: Path | None) -> int:
        assert tree is None
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

    def fake_run(argv, count, out, stem, progress=print, launch=None, before=None):  # noqa: ANN001, ANN202
        argvs.append(argv)
        assert before is None
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


def test_a_run_against_another_tree_takes_turns_and_compares_the_medians(tmp_path: Path) -> None:
    """Before's processes alternate with this tree's, each first in turn; the page gives each
    version's median, range and processes under 1.0, and how far the median moved."""
    tree = tmp_path / "old"
    seen: list[tuple[str, Path | None]] = []
    ours = {"s-before-p1": 0.95, "s-before-p2": 0.97, "s-before-p3": 1.01, "s-p1": 1.02, "s-p2": 0.99, "s-p3": 1.05}

    def launch(argv: list[str], where: Path | None) -> int:
        stem = argv[-1]
        seen.append((stem, where))
        (tmp_path / f"{stem}.json").write_text(json.dumps(_grid({256: ours[stem]}, {256: 1.0}).to_json()))
        return 0

    got = processes.run(["bench", "log_softmax", "--before", str(tree)], 3, tmp_path, "s", lambda _: None, launch, tree)
    assert seen == [
        ("s-before-p1", tree),
        ("s-p1", None),
        ("s-p2", None),
        ("s-before-p2", tree),
        ("s-before-p3", tree),
        ("s-p3", None),
    ]
    assert len(got) == 6
    md = (tmp_path / "s-spread.md").read_text()
    assert md.startswith(f"3 processes of this tree and 3 of `{tree}`, taking turns, each running `llmcompile bench")
    row = "| log_softmax | bfloat16 | 32768 | 256 | 0.970 | 0.950-1.010 | 2 of 3 | 1.020 | 0.990-1.050 | 1 of 3 | +0.050 |"
    assert row in md
    assert "Medians under 1.0, now: none" in md
    assert "Medians under 1.0, before: log_softmax bfloat16 32768x256 vs eager 0.970" in md
    assert "vs quack" not in md


def test_a_child_of_another_tree_imports_that_trees_llmcompile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through a fresh interpreter, run from this checkout (whose llmcompile `python -m` would find
    first): the child runs the tree's own package."""
    pkg = tmp_path / "old" / "llmcompile"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    mark = tmp_path / "ran"
    (pkg / "__main__.py").write_text(f"import sys\nopen({str(mark)!r}, 'w').write(__file__ + ' ' + sys.argv[1])\n")
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    assert processes._launch(["hello"], tmp_path / "old") == 0
    assert mark.read_text() == f"{pkg / '__main__.py'} hello"


def test_bench_refuses_a_before_tree_without_llmcompile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "softmax", "--processes", "2", "--before", str(tmp_path)]) == 2
    assert "no llmcompile/ in it" in capsys.readouterr().err


def test_bench_passes_the_before_tree_to_the_processes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import llmcompile.cli as cli

    tree = tmp_path / "old"
    (tree / "llmcompile").mkdir(parents=True)
    (tree / "llmcompile" / "__init__.py").write_text("")
    got: list[Path | None] = []

    def fake_run(argv, count, out, stem, progress=print, launch=None, before=None):  # noqa: ANN001, ANN202
        got.append(before)
        (out / f"{stem}-spread.md").write_text("the comparison\n")
        return [_grid({256: 1.0}, {256: 1.0})] * (2 * count)

    monkeypatch.setattr(cli, "require_gpu", lambda target: None)
    monkeypatch.setattr(processes, "run", fake_run)
    assert main(["bench", "softmax", "--before", str(tree), "--out", str(tmp_path)]) == 0
    assert got == [tree]
