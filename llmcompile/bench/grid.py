"""Benchmark ops against the hardware's limit and against other implementations.

In one process: the device copy bandwidth (the SOL of memory-bound ops) and, for compute-bound
ops, the dense GEMM throughput; then for each op, dtype and shape the median time with cold L2
of our kernel and of each baseline, as TB/s over the minimum bytes the op must move (or TFLOP/s
over the FLOPs it must do) and as % of that limit. Writes markdown tables, JSON and a PNG plot.
"""

from __future__ import annotations

import json
import math
import platform
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from llmcompile.bench import timing
from llmcompile.bench.baselines import BASELINES, Unavailable
from llmcompile.bench.plots import save_png
from llmcompile.specs import DTYPES, OpSpec, get_op


@dataclass
class BenchRow:
    op: str
    dtype: str
    m: int
    n: int
    impl: str
    ms: float | None
    tbs: float | None
    pct_sol: float | None
    note: str = ""
    unit: str = "TB/s"  # what `tbs` counts: TB/s, or TFLOP/s for a compute-bound op
    # each round's median ms, in the order the rounds ran (`bench_one`'s `rounds`; `ms` is their
    # median): round r of every implementation ran in the same stretch of time
    rounds_ms: list[float] = field(default_factory=list)


@dataclass
class BenchResult:
    gpu: str
    sol_tbs: float
    versions: dict[str, str]
    rows: list[BenchRow] = field(default_factory=list)
    copies: dict[str, float] = field(default_factory=dict)  # each copy measured; SOL is the best
    read_tbs: float = 0.0  # read-only stream: the ceiling for ops that write almost nothing
    graph: bool = True  # False: every implementation timed from eager calls, host time included
    compute: dict[str, float] = field(default_factory=dict)  # dtype -> dense GEMM TFLOP/s measured
    # set where a run was stopped (Ctrl-C, a time limit's SIGINT): the points measured are kept
    interrupted: str = ""

    def ceiling(self, op: str, dtype: str) -> float:
        """The limit an op's rows are a % of: the GEMM probe (compute-bound) or the copy."""
        compute = any(r.unit != "TB/s" for r in self.rows if (r.op, r.dtype) == (op, dtype))
        return self.compute.get(dtype, self.sol_tbs) if compute else self.sol_tbs

    def to_json(self) -> dict:
        return {
            "gpu": self.gpu,
            "sol_tbs": self.sol_tbs,
            "copies_tbs": self.copies,
            "read_tbs": self.read_tbs,
            "graph": self.graph,
            "gemm_tflops": self.compute,
            "versions": self.versions,
            "interrupted": self.interrupted,
            "rows": [asdict(r) for r in self.rows],
        }

    @classmethod
    def from_json(cls, d: dict) -> BenchResult:
        """The inverse of `to_json`: a grid read back from its bench.json, to plot or tabulate again."""
        return cls(
            d["gpu"],
            d["sol_tbs"],
            d.get("versions", {}),
            [BenchRow(**r) for r in d.get("rows", [])],
            d.get("copies_tbs", {}),
            d.get("read_tbs", 0.0),
            d.get("graph", True),
            d.get("gemm_tflops", {}),
            d.get("interrupted", ""),
        )

    def get(self, op: str, dtype: str, m: int, n: int, impl: str) -> BenchRow | None:
        for r in self.rows:
            if (r.op, r.dtype, r.m, r.n, r.impl) == (op, dtype, m, n, impl):
                return r
        return None


# the packages a timing depends on: the key each is reported under, and its distribution's name
_PACKAGES = {
    "cutlass": "nvidia-cutlass-dsl",
    "quack": "quack-kernels",
    "liger_kernel": "liger-kernel",
    "triton": "triton",
}


def versions() -> dict[str, str]:
    """The software a measurement was made with (from package metadata: importing QuACK and Liger
    to ask them would cost a GPU worker's start seconds)."""
    import importlib.metadata as md

    out = {"python": platform.python_version(), "torch": torch.__version__}
    for key, dist in _PACKAGES.items():
        try:
            out[key] = md.version(dist)
        except md.PackageNotFoundError:
            out[key] = "absent"
    if torch.cuda.is_available():
        out["cuda"] = str(torch.version.cuda)
        out["gpu"] = torch.cuda.get_device_name(0)
    return out


def input_sets(spec: OpSpec, m: int, n: int, dtype: str, seed: int = 0) -> list[list[torch.Tensor]]:
    """Enough independent random input sets on the GPU that rotating over them keeps L2 cold."""
    gen = torch.Generator().manual_seed(seed)
    count = timing.rotation_count(spec.bytes_moved(m, n, dtype))
    return [spec.make_inputs(m, n, dtype, gen, "random", "cuda") for _ in range(count)]


def bench_one(
    spec: OpSpec,
    ours: Callable[..., object],
    m: int,
    n: int,
    dtype: str,
    sol_tbs: float,
    baselines: Iterable[str],
    seed: int = 0,
    ceiling_tbs: float | None = None,
    check: Callable[[list[list[torch.Tensor]], Callable[[], None] | None], str | None] | None = None,
    graph: bool = True,
    rounds: int = 1,
    sets: list[list[torch.Tensor]] | None = None,
    inside: dict[str, Callable[[], AbstractContextManager[None]]] | None = None,
    spent: dict[str, float] | None = None,
) -> list[BenchRow]:
    """Time ours and each baseline on the same rotated input sets (`sets`, or `input_sets`); with `rounds` > 1 they take
    turns that many times (in a rotated order) and each keeps its median round, so a slow spell
    of the host or of the clocks falls on all of them alike. A rate above 1.05x the
    ceiling (the best of copy and read-only bandwidth, when measured; the GEMM probe for a
    compute-bound op, whose rates and `sol_tbs` are TFLOP/s) is flagged IMPOSSIBLE.
    `check(sets, replay)`, run once every implementation is timed, says what is wrong with what
    our timed calls wrote (None: nothing; `replay` makes those calls again as timed, for a call
    that must follow them closely); its answer is flagged WRONG TIMED OUTPUT on our row. `inside`: a
    context each timing of the named implementation runs in (the judge's: inputs read-only).
    `spent`: seconds added by implementation (a baseline's making too: torch.compile's compile),
    "checks" and "settle" (`timing.spending`)."""
    work = spec.work(m, n, dtype)
    own_sets = sets is None
    sets = input_sets(spec, m, n, dtype, seed) if sets is None else sets
    scalars = dict(spec.scalars)
    impls: dict[str, list[Callable[[], object]] | str] = {
        "llmcompile": [lambda s=s: ours(*s) for s in sets],
    }
    for b in baselines:
        try:
            with timing.spending(spent, b):
                impls[b] = [BASELINES[b](spec, s, scalars) for s in sets]
        except Unavailable as e:
            impls[b] = str(e)
    rows = []
    errors: dict[str, str] = {name: calls for name, calls in impls.items() if isinstance(calls, str)}
    replayed = ("llmcompile",) if check is not None else ()  # (ours, for the check: `check`)
    timings = time_in_turns(
        {k: v for k, v in impls.items() if not isinstance(v, str)}, rounds, graph, errors, inside, replayed, spent
    )
    for name in impls:
        if name in errors:
            rows.append(BenchRow(spec.name, dtype, m, n, name, None, None, None, errors[name], spec.unit))
            continue
        t = median_round(timings[name])
        bw = timing.tbs(work, t.median_ms)  # (of FLOPs: TFLOP/s)
        notes = [] if t.graph or not graph else ["no graph"]
        if bw > 1.05 * (ceiling_tbs or sol_tbs):
            limit = "dense GEMM throughput" if spec.compute_bound else "device bandwidth"
            notes.append(f"IMPOSSIBLE: above 1.05x the {limit}")
        if t.events_disagree:
            notes.append(f"TIMER MISMATCH: events {t.median_ms:.4f} ms vs wall clock {t.wall_ms:.4f} ms a call")
        note = "; ".join(notes)
        each = [x.median_ms for x in timings[name]]
        rows.append(BenchRow(spec.name, dtype, m, n, name, t.median_ms, bw, 100 * bw / sol_tbs, note, spec.unit, each))
    # (after every implementation is timed: the float64 check lowers the clocks for seconds, and
    # whatever were timed next would run slow)
    if check is not None and rows and rows[0].impl == "llmcompile" and rows[0].tbs is not None:
        with timing.spending(spent, "checks"):
            wrong = check(sets, timings["llmcompile"][-1].replay)
        if wrong:
            mine = rows[0]
            mine.note = "; ".join(filter(None, (mine.note, f"WRONG TIMED OUTPUT: {wrong}")))
        with timing.spending(spent, "settle"):
            timing.settle(sol_tbs if not spec.compute_bound else None)  # (before the next shape is timed)
    if own_sets:
        del sets
        torch.cuda.empty_cache()
    return rows


def time_in_turns(
    calls: dict[str, list[Callable[[], object]]],
    rounds: int,
    graph: bool,
    errors: dict[str, str],
    inside: dict[str, Callable[[], AbstractContextManager[None]]] | None = None,
    keep: tuple[str, ...] = (),
    spent: dict[str, float] | None = None,
) -> dict[str, list[timing.Timing]]:
    """Each implementation's calls timed `rounds` times, the implementations taking turns in a
    rotated order, so that a slow spell of the host or of the clocks falls on all of them alike;
    one that fails is put in `errors` (reported, not fatal) and not timed again. `inside`: as
    `bench_one`'s; `keep`: the implementations whose last timing keeps its work to replay; `spent`:
    seconds added by implementation (`timing.spending`)."""
    timings: dict[str, list[timing.Timing]] = {}
    order = list(calls)
    for r in range(rounds):
        k = r % len(order) if order else 0
        for name in order[k:] + order[:k]:
            if name in errors:  # (failed in an earlier round)
                continue
            try:
                with timing.spending(spent, name), (inside or {}).get(name, nullcontext)():
                    kept = {"keep": True} if name in keep else {}
                    timings.setdefault(name, []).append(timing.time_calls(calls[name], graph=graph, **kept))
            except Exception as e:  # noqa: BLE001 - a baseline that fails to run is reported, not fatal
                errors[name] = f"{type(e).__name__}: {e}"[:200]
                torch.cuda.synchronize()
    return timings


def median_round(rounds: list[timing.Timing]) -> timing.Timing:
    return sorted(rounds, key=lambda x: x.median_ms)[len(rounds) // 2]


def run(
    ops: list[str],
    dtypes: list[str],
    shapes: list[tuple[int, int]] | None,  # None: each op's own grid (OpSpec.shapes)
    baselines: list[str],
    functions: dict[str, Callable[..., object]],
    progress: Callable[[str], None] = print,
    copy_kernel: Callable[[torch.Tensor, torch.Tensor], object] | None = None,
    read_probes: dict[str, Callable[[int], tuple[Callable[[], object], int]]] | None = None,
    graph: bool = True,
    rounds: int = 1,
) -> BenchResult:
    copies = timing.copy_bandwidths({"cute copy": copy_kernel} if copy_kernel else None)
    sol = max(copies.values())
    read = timing.read_bandwidth(read_probes)
    result = BenchResult(torch.cuda.get_device_name(0), sol, versions(), copies=copies, read_tbs=read, graph=graph)
    progress(
        "device copy bandwidth (SOL): "
        + ", ".join(f"{k} {v:.3f}" for k, v in copies.items())
        + f" TB/s; read-only stream {read:.3f} TB/s"
    )
    with until_interrupted(result, progress):
        for op in ops:
            spec = get_op(op)
            for dtype in dtypes:
                if dtype not in spec.dtypes:
                    progress(f"{op}: no {dtype} (it takes {', '.join(spec.dtypes)})")
                    continue
                limit, ceiling = sol, max(sol, read)
                if spec.compute_bound:
                    if dtype not in result.compute:
                        result.compute[dtype] = timing.gemm_tflops(DTYPES[dtype])
                        progress(f"dense GEMM probe {dtype}: {result.compute[dtype]:.0f} TFLOP/s")
                    limit = ceiling = result.compute[dtype]
                for m, n in shapes if shapes is not None else spec.shapes():
                    rows = bench_one(
                        spec, functions[op], m, n, dtype, limit, baselines, ceiling_tbs=ceiling, graph=graph,
                        rounds=rounds,
                    )  # fmt: skip
                    result.rows.extend(rows)
                    progress(
                        f"{op:13s} {dtype:8s} M={m:<8d} N={n:<7d} "
                        + "  ".join(f"{r.impl}={r.tbs:.2f}" if r.tbs else f"{r.impl}=n/a" for r in rows)
                        + ("" if spec.unit == "TB/s" else f" {spec.unit}")
                    )
    return result


@contextmanager
def until_interrupted(result: BenchResult, progress: Callable[[str], None]) -> Iterator[None]:
    """A grid stopped by Ctrl-C or a time limit's SIGINT keeps the points it measured: the caller
    writes them, marked as an interrupted run, instead of losing minutes of GPU time."""
    try:
        yield
    except KeyboardInterrupt:
        points = len({(r.op, r.dtype, r.m, r.n) for r in result.rows})
        result.interrupted = f"interrupted after {points} points"
        progress(f"{result.interrupted}: writing what was measured")


def markdown(result: BenchResult) -> str:
    compute = [r for r in result.rows if r.unit != "TB/s"]
    lines = (
        _memory_table(result, [r for r in result.rows if r.unit == "TB/s"]) if len(compute) < len(result.rows) else []
    )
    if compute:
        lines += ([""] if lines else []) + _compute_table(result, compute)
    if result.interrupted:
        lines += ["", f"({result.interrupted}: the grid is not complete)"]
    return "\n".join(lines) + "\n"


def _compute_table(result: BenchResult, rows: list[BenchRow]) -> list[str]:
    impls = list(dict.fromkeys(r.impl for r in rows))
    probes = ", ".join(f"{d} {v:.0f}" for d, v in result.compute.items())
    lines = [
        f"GPU: {result.gpu}; dense GEMM probe (torch.matmul 8192^3): {probes} TFLOP/s; TFLOP/s over the op's FLOPs"
        + ("" if result.graph else "; every call eager, without CUDA graphs (host time included)"),
        "",
        "| op | dtype | M | N | "
        + " | ".join(f"{i} TFLOP/s" for i in impls)
        + " | ours % GEMM | ours / fastest other |",
        "|---|---|---|---|" + "---|" * len(impls) + "---|---|",
    ]
    for key in dict.fromkeys((r.op, r.dtype, r.m, r.n) for r in rows):
        cells = [f"{r.tbs:.0f}" if (r := result.get(*key, i)) and r.tbs else "n/a" for i in impls]
        ours = result.get(*key, "llmcompile")
        others = [r.tbs for r in rows if (r.op, r.dtype, r.m, r.n) == key and r.impl != "llmcompile" and r.tbs]
        pct = f"{ours.pct_sol:.1f}" if ours and ours.pct_sol else "n/a"
        ratio = f"{ours.tbs / max(others):.3f}" if ours and ours.tbs and others else "n/a"
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | " + " | ".join(cells) + f" | {pct} | {ratio} |")
    return lines


def _memory_table(result: BenchResult, rows: list[BenchRow]) -> list[str]:
    impls = list(dict.fromkeys(r.impl for r in rows))
    # With rounds, how far the ratio moved between them: ours and QuACK's times of the same round
    # (run back to back), the lowest and highest ratio of any round. A median below 1.0 whose
    # rounds reach above it is a tie within the run's own noise, not a deficit.
    by_round = any(len(r.rounds_ms) > 1 for r in rows)
    with_eager = "eager" in impls  # (a training step's done-when: at least torch eager's rate at every point)
    lines = [
        f"GPU: {result.gpu}; device copy (SOL, best of {', '.join(f'{k} {v:.3f}' for k, v in result.copies.items())}): "
        f"{result.sol_tbs:.3f} TB/s; "
        + (
            f"read-only stream {result.read_tbs:.3f} TB/s; " if result.read_tbs else ""
        )  # (not probed for training steps)
        + "TB/s over the minimum bytes, cold L2"
        + ("" if result.graph else "; every call eager, without CUDA graphs (host time included)"),
        "",
        "| op | dtype | M | N | "
        + " | ".join(f"{i} TB/s" for i in impls)
        + " | ours % SOL | ours / QuACK |"
        + (" ours / QuACK by round |" if by_round else "")
        + (" ours / eager |" if with_eager else ""),
        "|---|---|---|---|"
        + "---|" * len(impls)
        + "---|---|"
        + ("---|" if by_round else "")
        + ("---|" if with_eager else ""),
    ]
    keys = list(dict.fromkeys((r.op, r.dtype, r.m, r.n) for r in rows))
    for key in keys:
        cells = []
        for i in impls:
            r = result.get(*key, i)
            cells.append(f"{r.tbs:.2f}" if r and r.tbs else "n/a")
        ours = result.get(*key, "llmcompile")
        q = result.get(*key, "quack")
        pct = f"{ours.pct_sol:.1f}" if ours and ours.pct_sol else "n/a"
        ratio = f"{ours.tbs / q.tbs:.3f}" if ours and ours.tbs and q and q.tbs else "n/a"
        line = f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | " + " | ".join(cells) + f" | {pct} | {ratio} |"
        if by_round:
            line += f" {_round_range(ours, q)} |"
        if with_eager:
            e = result.get(*key, "eager")
            line += f" {ours.tbs / e.tbs:.3f} |" if ours and ours.tbs and e and e.tbs else " n/a |"
        lines.append(line)
    return lines


def _round_range(ours: BenchRow | None, other: BenchRow | None) -> str:
    """min-max over the rounds of other's time / ours (a rate ratio), or n/a."""
    if not (ours and other and ours.tbs and other.tbs) or len(ours.rounds_ms) != len(other.rounds_ms):
        return "n/a"
    ratios = [theirs / mine for mine, theirs in zip(ours.rounds_ms, other.rounds_ms)]
    return f"{min(ratios):.3f}-{max(ratios):.3f}"


def plot(result: BenchResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys((r.op, r.dtype) for r in result.rows))
    cols = min(3, len(groups)) or 1
    rows_n = math.ceil(len(groups) / cols) or 1
    fig, axes = plt.subplots(rows_n, cols, figsize=(5 * cols, 3.6 * rows_n), squeeze=False)
    for ax, (op, dtype) in zip(axes.flat, groups):
        sub = [r for r in result.rows if r.op == op and r.dtype == dtype and r.tbs]
        for impl in dict.fromkeys(r.impl for r in sub):
            pts = sorted((r.n, r.tbs) for r in sub if r.impl == impl)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
        unit = sub[0].unit if sub else "TB/s"
        limit = "dense GEMM" if unit != "TB/s" else "device copy (SOL)"
        ax.axhline(result.ceiling(op, dtype), color="k", linestyle="--", linewidth=1, label=limit)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{op} {dtype}")
        ax.set_xlabel("N")
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(groups) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"{result.gpu}: rate vs N (cold L2)")
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)


def write(result: BenchResult, out_dir: Path, stem: str = "bench") -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / f"{stem}.json", "md": out_dir / f"{stem}.md", "png": out_dir / f"{stem}.png"}
    paths["json"].write_text(json.dumps(result.to_json(), indent=1))
    paths["md"].write_text(markdown(result))
    plot(result, paths["png"])
    return paths
