"""The bench repeated in fresh processes, one table each, and how far each ratio moved across them.

A host-bound point (a small step timed eagerly) moves more from process to process than within
one: which cores the threads land on, the allocator's first blocks and the host's other work
are drawn once a process (H100: one log_softmax point read 0.84-1.13x torch eager over eight
processes, evals/results/training-step). Rounds inside one process cannot show that; K processes
can, and the median of their ratios says on which side of 1.0 a point lies.
"""

from __future__ import annotations

import json
import signal
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llmcompile.bench.grid import BenchResult

# what a child is run with: its argv after `python -m llmcompile`; returns its exit status
Launch = Callable[[list[str]], int]

CHILD_WAIT_S = 120  # how long an interrupted child may take to write the points it measured


def child_argv(argv: list[str], stem: str, index: int) -> list[str]:
    """The parent's `bench` argv for child `index` (1-based): without --processes, its own stem."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--processes", "--stem"):
            skip = True
            continue
        if a.startswith(("--processes=", "--stem=")):
            continue
        out.append(a)
    return [*out, "--stem", f"{stem}-p{index}"]


def _launch(argv: list[str], command: tuple[str, ...] = (sys.executable, "-m", "llmcompile")) -> int:
    """Child in a fresh interpreter, its output on ours; a Ctrl-C or a time limit's SIGINT is passed
    on, and it gets CHILD_WAIT_S to write what it measured before it is killed."""
    # (a session of its own: a Ctrl-C at the terminal reaches the parent alone, which passes one
    # SIGINT on; a second one, from the terminal, would cut the child's writing short)
    proc = subprocess.Popen([*command, *argv], start_new_session=True)
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
    argv: list[str], count: int, out: Path, stem: str, progress: Callable[[str], None] = print, launch: Launch = _launch
) -> list[BenchResult]:
    """`count` processes of the same bench, one after another (they would share the GPU otherwise),
    each writing `{stem}-p{i}` under `out`; then `{stem}-spread.md`. Returns the grids read back,
    the interrupted one's too; a child that wrote nothing is said and skipped."""
    results: list[BenchResult] = []
    labels: list[str] = []  # (the processes that wrote a table: a column each)

    def take(i: int) -> bool:
        """Keep process i's table where it wrote one."""
        if (got := _read(out / f"{stem}-p{i}.json")) is None:
            return False
        results.append(got)
        labels.append(f"p{i}")
        return True

    i = 0
    try:
        for i in range(1, count + 1):
            progress(f"== process {i} of {count}")
            rc = launch(child_argv(argv, stem, i))
            if not take(i):
                progress(f"process {i} wrote no table (exit status {rc})")
    except KeyboardInterrupt:
        take(i)
        progress(f"interrupted in process {i} of {count}: the spread of the {len(results)} with a table")
    if results:
        (out / f"{stem}-spread.md").write_text(markdown(results, argv, labels))
    return results


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


def markdown(results: list[BenchResult], argv: list[str], labels: list[str] | None = None) -> str:
    """One table for each baseline measured: the ratio in each process (`labels`: its column's
    name, p1, p2, ... where not given), its range and median; then the points whose median is
    under 1.0."""
    first = results[0]
    mode = "CUDA graphs" if first.graph else "eager calls, without CUDA graphs (host time included)"
    gpus = sorted({r.gpu for r in results})
    lines = [
        f"{len(results)} processes of `llmcompile {' '.join(argv)}`, one after another; {mode}; "
        f"{', '.join(gpus)}; torch {first.versions.get('torch', '?')}",
        "",
        "Ours / each baseline (ratio of the rates), a column a process (each its own table, `-pI.md`).",
    ]
    if any(r.interrupted for r in results):
        lines.append("(a process was interrupted: its columns hold the points it measured)")
    baselines = list(dict.fromkeys(r.impl for res in results for r in res.rows if r.impl != "llmcompile"))
    under: list[str] = []
    for against in baselines:
        rows = spreads(results, against)
        if not rows:
            continue
        head = " | ".join(labels or [f"p{i}" for i in range(1, len(results) + 1)])
        lines += ["", f"vs {against}:", "", f"| op | dtype | M | N | {head} | range | median |"]
        lines.append("|---|---|---|---|" + "---|" * len(results) + "---|---|")
        for s in rows:
            cells = " | ".join("" if r is None else f"{r:.3f}" for r in s.ratios)
            rng = f"{min(s.measured):.3f}-{max(s.measured):.3f}"
            lines.append(f"| {s.op} | {s.dtype} | {s.m} | {s.n} | {cells} | {rng} | {s.median:.3f} |")
            if s.median is not None and s.median < 1.0:
                under.append(f"{s.op} {s.dtype} {s.m}x{s.n} vs {against} {s.median:.3f}")
    lines += ["", "Medians under 1.0: " + ("; ".join(under) if under else "none")]
    return "\n".join(lines) + "\n"
