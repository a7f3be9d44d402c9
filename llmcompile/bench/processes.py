"""The bench repeated in fresh processes, one table each, and how far each ratio moved across them.

A host-bound point (a small step timed eagerly) moves more from process to process than within
one: which cores the threads land on, the allocator's first blocks and the host's other work
are drawn once a process (H100: one log_softmax point read 0.84-1.13x torch eager over eight
processes, evals/results/training-step). Rounds inside one process cannot show that; K processes
can, and the median of their ratios says on which side of 1.0 a point lies. With a tree of another
version (`before`), its processes alternate with this one's, so a change is judged by how it moved
those medians, both versions drawn from the same host's moods.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llmcompile.bench.grid import BenchResult

# what a child is run with: its argv after `python -m llmcompile`, and the tree it imports llmcompile
# from (None: this one); returns its exit status
Launch = Callable[[list[str], Path | None], int]

CHILD_WAIT_S = 120  # how long an interrupted child may take to write the points it measured


def child_argv(argv: list[str], stem: str, index: int) -> list[str]:
    """The parent's `bench` argv for child `index` (1-based): without --processes, its own stem."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--processes", "--stem", "--before"):
            skip = True
            continue
        if a.startswith(("--processes=", "--stem=", "--before=")):
            continue
        out.append(a)
    return [*out, "--stem", f"{stem}-p{index}"]


def _launch(argv: list[str], tree: Path | None = None, command: tuple[str, ...] | None = None) -> int:
    """Child in a fresh interpreter, its output on ours, importing llmcompile from `tree` where
    given; a Ctrl-C or a time limit's SIGINT is passed on, and it gets CHILD_WAIT_S to write what it
    measured before it is killed."""
    env = None
    if command is None and tree is None:
        command = (sys.executable, "-m", "llmcompile")
    elif command is None:
        # (-P: `python -m` would put the working directory, perhaps this checkout, ahead of
        # PYTHONPATH; an editable install's finder comes after both)
        command = (sys.executable, "-P", "-m", "llmcompile")
        paths = [str(tree.resolve()), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    # (a session of its own: a Ctrl-C at the terminal reaches the parent alone, which passes one
    # SIGINT on; a second one, from the terminal, would cut the child's writing short)
    proc = subprocess.Popen([*command, *argv], start_new_session=True, env=env)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(CHILD_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise


def run(
    argv: list[str],
    count: int,
    out: Path,
    stem: str,
    progress: Callable[[str], None] = print,
    launch: Launch = _launch,
    before: Path | None = None,
) -> list[BenchResult]:
    """`count` processes of the same bench, one after another (they would share the GPU otherwise),
    each writing `{stem}-p{i}` under `out`; with `before` (another version's tree), as many of its
    code (`{stem}-before-p{i}`), the two in turn, first one and then the other first; then
    `{stem}-spread.md`. Returns the grids read back (this tree's, then before's), the interrupted
    one's too; a child that wrote nothing is said and skipped."""
    now: list[BenchResult] = []
    old: list[BenchResult] = []
    labels: dict[bool, list[str]] = {False: [], True: []}  # (the processes that wrote a table: a column each)

    def take(i: int, is_before: bool) -> bool:
        """Keep process i's table where it wrote one."""
        name = f"{stem}-before-p{i}" if is_before else f"{stem}-p{i}"
        if (got := _read(out / f"{name}.json")) is None:
            return False
        (old if is_before else now).append(got)
        labels[is_before].append(f"p{i}")
        return True

    i, is_before = 0, False
    try:
        for i in range(1, count + 1):
            turns = [False] if before is None else [i % 2 == 1, i % 2 == 0]
            for is_before in turns:
                which = f" (before: {before})" if is_before else " (this tree)" if before else ""
                progress(f"== process {i} of {count}{which}")
                child = child_argv(argv, f"{stem}-before" if is_before else stem, i)
                rc = launch(child, before if is_before else None)
                if not take(i, is_before):
                    progress(f"process {i}{which} wrote no table (exit status {rc})")
    except KeyboardInterrupt:
        take(i, is_before)
        progress(f"interrupted in process {i} of {count}: the spread of the {len(now) + len(old)} with a table")
    if now and before is not None and old:
        text = comparison(now, old, argv, before)
    elif now or old:
        text = markdown(now or old, argv, labels[False] or labels[True])
    else:
        return []
    (out / f"{stem}-spread.md").write_text(text)
    return now + old


def _read(path: Path) -> BenchResult | None:
    try:
        return BenchResult.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass(frozen=True)
class Spread:
    op: str
    dtype: str
    m: int
    n: int
    against: str
    ratios: list[float | None]  # ours' rate / theirs, a process each (None: not measured there)

    @property
    def measured(self) -> list[float]:
        return [r for r in self.ratios if r is not None]

    @property
    def median(self) -> float | None:
        return statistics.median(self.measured) if self.measured else None

    def named(self) -> str:
        """The point, its baseline and its median, as the lists of medians under 1.0 name it."""
        return f"{self.op} {self.dtype} {self.m}x{self.n} vs {self.against} {self.median:.3f}"


def spreads(results: list[BenchResult], against: str) -> list[Spread]:
    """Each point's ratio of our rate to `against`'s, a process each, in the order of the points."""
    keys = dict.fromkeys((r.op, r.dtype, r.m, r.n) for res in results for r in res.rows)
    out = []
    for key in keys:
        ratios: list[float | None] = []
        for res in results:
            ours, theirs = res.get(*key, "llmcompile"), res.get(*key, against)
            ok = ours and theirs and ours.tbs and theirs.tbs
            ratios.append(ours.tbs / theirs.tbs if ok else None)
        if any(r is not None for r in ratios):
            out.append(Spread(*key, against, ratios))
    return out


def _head(results: list[BenchResult], argv: list[str], what: str) -> str:
    first = results[0]
    mode = "CUDA graphs" if first.graph else "eager calls, without CUDA graphs (host time included)"
    gpus = sorted({r.gpu for r in results})
    return f"{what} `llmcompile {' '.join(argv)}`, one after another; {mode}; {', '.join(gpus)}; torch {first.versions.get('torch', '?')}"


def _baselines(results: list[BenchResult]) -> list[str]:
    return list(dict.fromkeys(r.impl for res in results for r in res.rows if r.impl != "llmcompile"))


def markdown(results: list[BenchResult], argv: list[str], labels: list[str] | None = None) -> str:
    """One table for each baseline measured: the ratio in each process (`labels`: its column's
    name, p1, p2, ... where not given), its range and median; then the points whose median is
    under 1.0."""
    lines = [
        _head(results, argv, f"{len(results)} processes of"),
        "",
        "Ours / each baseline (ratio of the rates), a column a process (each its own table, `-pI.md`).",
    ]
    if any(r.interrupted for r in results):
        lines.append("(a process was interrupted: its columns hold the points it measured)")
    under: list[str] = []
    for against in _baselines(results):
        rows = spreads(results, against)
        if not rows:
            continue
        head = " | ".join(labels or [f"p{i}" for i in range(1, len(results) + 1)])
        lines += ["", f"vs {against}:", "", f"| op | dtype | M | N | {head} | range | median |"]
        lines.append("|---|---|---|---|" + "---|" * len(results) + "---|---|")
        for s in rows:
            cells = " | ".join("" if r is None else f"{r:.3f}" for r in s.ratios)
            lines.append(f"| {s.op} | {s.dtype} | {s.m} | {s.n} | {cells} | {_range(s)} | {s.median:.3f} |")
            if s.median is not None and s.median < 1.0:
                under.append(s.named())
    lines += ["", "Medians under 1.0: " + ("; ".join(under) if under else "none")]
    return "\n".join(lines) + "\n"


def _range(s: Spread) -> str:
    return f"{min(s.measured):.3f}-{max(s.measured):.3f}"


def comparison(
    now: list[BenchResult],
    before: list[BenchResult],
    argv: list[str],
    tree: Path,
) -> str:
    """This tree's processes against `tree`'s: for each baseline and point, each version's median
    ratio, its range and how many of its processes read under 1.0, and the median's move; then the
    points whose median is under 1.0 in each. (Each process's own table: `-pI.md`, `-before-pI.md`.)"""
    lines = [
        _head(
            now + before,
            argv,
            f"{len(now)} processes of this tree and {len(before)} of `{tree}`, taking turns, each running",
        ),
        "",
        "Ours / each baseline (ratio of the rates): its median over each version's processes, the range,",
        "and how many processes read under 1.0.",
    ]
    if any(r.interrupted for r in now + before):
        lines.append("(a process was interrupted: its points hold what it measured)")
    under: dict[str, list[str]] = {"now": [], "before": []}
    for against in _baselines(now + before):
        mine = {(s.op, s.dtype, s.m, s.n): s for s in spreads(now, against)}
        theirs = {(s.op, s.dtype, s.m, s.n): s for s in spreads(before, against)}
        if not mine and not theirs:
            continue
        lines += ["", f"vs {against}:", ""]
        lines.append(
            "| op | dtype | M | N | before: median | range | under 1.0 | now: median | range | under 1.0 | move |"
        )
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
        for key in dict.fromkeys([*theirs, *mine]):
            cells: list[str] = []
            for name, s in (("before", theirs.get(key)), ("now", mine.get(key))):
                if s is None:
                    cells += ["", "", ""]
                    continue
                cells += [f"{s.median:.3f}", _range(s), f"{sum(r < 1.0 for r in s.measured)} of {len(s.measured)}"]
                if s.median < 1.0:
                    under[name].append(s.named())
            a, b = theirs.get(key), mine.get(key)
            move = f"{b.median - a.median:+.3f}" if a and b else ""
            lines.append(f"| {' | '.join(map(str, key))} | {' | '.join(cells)} | {move} |")
    for name in ("now", "before"):
        lines += ["", f"Medians under 1.0, {name}: " + ("; ".join(under[name]) if under[name] else "none")]
    return "\n".join(lines) + "\n"
