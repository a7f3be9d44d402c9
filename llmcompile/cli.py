"""The `llmcompile` command. Thin: every subcommand is a call into the modules."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from llmcompile import COMMANDS
from llmcompile.agent.session import ATTENTION_BASELINES, RunRequest, UsageError, parse_shapes
from llmcompile.bench.baselines import parse_baselines
from llmcompile.harness.sandbox import SandboxUnavailable
from llmcompile.harness.worker import JUDGE_FAILED_RC, JudgeFailure
from llmcompile.specs import (
    BENCH_ELEMS,
    BENCH_N,
    BUILTIN,
    SMALL_M,
    SMALL_N,
    OpError,
    bench_shapes,
    dtype_name,
)
from llmcompile.specs.targets import DEFAULT_TARGET, TARGETS, TargetError, get_target, require_gpu
from llmcompile.suites.suite import SuiteError


def cmd_list(args: argparse.Namespace) -> int:
    print("ops:")
    for s in BUILTIN.values():
        ins = ", ".join(t.name for t in s.inputs)
        outs = ", ".join(t.name for t in s.outputs)
        sc = ", ".join(f"{k}={v}" for k, v in s.scalars.items())
        print(f"  {s.name:14s} {s.summary}  [{ins} -> {outs}{'; ' + sc if sc else ''}]")
    from llmcompile.specs.kernelbench import load_dir, load_problem

    paths = [Path(p) for p in args.problems] or [p for p in (Path("evals/problems"),) if p.is_dir()]
    for path in paths:
        specs, errors = load_dir(path) if path.is_dir() else ([load_problem(path)], {})
        print(f"custom ops (KernelBench files) in {path}:")
        for s in specs:
            dims = ", ".join(f"{t.name}({'x'.join(t.dims)})" for t in s.tensors)
            sc = "".join(f", {k}={v}" for k, v in s.scalars.items())
            print(f"  {s.name:14s} {s.summary}  [{dims}{sc}; {s.dtypes[0]}]")
        for name, why in errors.items():
            print(f"  {name}: NOT LOADED: {why}")
    print("targets:")
    for t in TARGETS.values():
        print(
            f"  {t.name:6s} {t.arch}, {t.sms} SMs, {t.smem_per_sm_kb} KB smem/SM, clusters up to {t.max_cluster}, "
            f"{t.nominal_bandwidth_tbs} TB/s nominal"
        )
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from llmcompile.doctor import report

    ok, text = report()
    print(text)
    return 0 if ok else 1


def cmd_bench(args: argparse.Namespace) -> int:
    from llmcompile.bench import grid
    from llmcompile.bench.train import TRAIN_OPS
    from llmcompile.kernels import BY_NAME, READ_PROBES, copy_probe

    target = get_target(args.target)
    known = TRAIN_OPS if args.train else BUILTIN
    ops = [o for o in known if o != "copy"] if args.ops == ["all"] else args.ops
    for op in ops:
        if op not in known:
            what = "training step" if args.train else "op"
            raise OpError(f"unknown {what} {op!r}; known: {', '.join(sorted(known))}")
    if args.processes < 1:
        raise UsageError(f"--processes {args.processes}: give 1 or more")
    before = Path(args.before) if args.before else None
    if before is not None and not (before / "llmcompile" / "__init__.py").is_file():
        raise UsageError(
            f"--before {before}: no llmcompile/ in it; give a copy of another version's tree "
            "(e.g. `git worktree add DIR REV`, or `git archive REV llmcompile reference_kernels | tar -x -C DIR`)"
        )
    require_gpu(target)
    dtypes = [dtype_name(d) for d in args.dtype]
    shapes: list[tuple[int, int]] | None = None  # each op's own grid (attention's is fixed)
    if args.small:
        shapes = [(SMALL_M, n) for n in SMALL_N]
        # (QuACK's small grid is for row ops: 32768 heads of attention would need 68 GB)
        ops = [o for o in ops if not BUILTIN[o].compute_bound or args.ops != ["all"]]
    elif args.shapes or args.elems != BENCH_ELEMS:
        shapes = parse_shapes(args.shapes) or bench_shapes(args.elems)
    baselines = parse_baselines(args.baselines)
    if args.processes > 1 or before is not None:
        from llmcompile.bench import processes

        results = processes.run(args.argv, args.processes, Path(args.out), args.stem, before=before)
        spread = Path(args.out) / f"{args.stem}-spread.md"
        print(spread.read_text() if results else "no process wrote a table")
        return 0 if len(results) == args.processes * (1 if before is None else 2) else 1
    if args.train:
        from llmcompile.bench import train

        result = train.run(
            ops, dtypes, shapes, ["llmcompile", *baselines], graph=not args.no_graph, rounds=args.rounds,
            copy_kernel=copy_probe,
        )  # fmt: skip
        paths = grid.write(result, Path(args.out), args.stem)
        print(grid.markdown(result))
        print("wrote " + ", ".join(str(p) for p in paths.values()))
        return 0
    result = grid.run(
        ops,
        dtypes,
        shapes,
        baselines,
        dict(BY_NAME),
        copy_kernel=copy_probe,
        read_probes=READ_PROBES,
        graph=not args.no_graph,
        rounds=args.rounds,
    )
    paths = grid.write(result, Path(args.out), args.stem)
    print(grid.markdown(result))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def _stage_lines(v) -> list[str]:
    lines = []
    st = v.static
    lines.append(
        f"static   {'ok' if st and st.ok else 'REJECTED'}" + ("" if not st or st.ok else ": " + "; ".join(st.problems))
    )
    if v.compile:
        c = v.compile
        res = "; ".join(v.resources())
        lines.append(f"compile  {'ok' if c.ok else 'FAILED'} ({c.seconds:.1f} s, N={c.n}) {res}")
    if v.verify:
        r = v.verify
        lines.append(
            f"verify   {'ok' if r.ok else 'FAILED'}: {r.runs} checked runs, {len(r.shapes)} shapes ({r.seconds:.1f} s)"
        )
    if v.profile:
        p = v.profile
        limits = (
            f"dense GEMM {p.sol_tbs:.0f} {p.unit}"
            if p.unit != "TB/s"
            else f"device copy {p.sol_tbs:.3f} TB/s, read-only {p.read_tbs:.3f} TB/s"
        )
        lines.append(f"profile  {'ok' if p.ok else 'FLAGGED'}: {limits}")
    return lines


def _profile_table(v) -> str:
    if not v.profile:
        return ""
    impls = sorted({k for s in v.profile.shapes for k in s.baselines})
    u = v.profile.unit
    head = f"| M | N | ms | {u} | % SOL | " + " | ".join(f"{i} {u}" for i in impls) + " |"
    out = [head, "|---" * (5 + len(impls)) + "|"]
    for s in v.profile.shapes:
        cells = " | ".join(f"{s.baselines[i]:.2f}" if i in s.baselines else "n/a" for i in impls)
        out.append(f"| {s.m} | {s.n} | {s.ms:.4f} | {s.tbs:.3f} | {s.pct_sol:.1f} | {cells} |")
    return "\n".join(out)


def cmd_check(args: argparse.Namespace) -> int:
    import json

    from llmcompile.harness import STAGES, Judge, JudgeOptions
    from llmcompile.specs import get_op

    path = Path(args.kernel)
    if not path.is_file():
        raise UsageError(f"no such kernel file: {path}")
    spec = get_op(args.op)
    dtype = dtype_name(args.dtype) if args.dtype else spec.dtypes[0]
    target = get_target(args.target)
    stages = tuple(s for s in STAGES if s in args.stages.split(","))
    opts = JudgeOptions(
        stages=stages, profile_shapes=parse_shapes(args.shapes), baselines=parse_baselines(args.baselines)
    )
    with Judge(target.name, unsafe_no_sandbox=args.unsafe_no_sandbox) as judge:
        v = judge.evaluate(path.read_text(), spec, dtype, opts)
    if args.json:
        print(json.dumps(v.to_json(), indent=1))
    else:
        print(f"{path} as {spec.name} ({dtype}) for {target.name}: {v.status.upper()}")
        print("\n".join(_stage_lines(v)))
        if v.profile:
            print(_profile_table(v))
        print(v.message)
    if not v.passed:
        return 1
    asked_gpu = {"verify", "profile"} & set(stages)
    return 3 if asked_gpu and not (v.verify or v.profile) else 0


def cmd_run(args: argparse.Namespace) -> int:
    from llmcompile.agent.session import RunRequest, run_problem

    fields = {f.name for f in dataclasses.fields(RunRequest)}
    return run_problem(RunRequest(**{k: v for k, v in vars(args).items() if k in fields}))


def cmd_eval(args: argparse.Namespace) -> int:
    import os

    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from llmcompile.suites import report
    from llmcompile.suites.runner import EvalOptions, EvalRunner
    from llmcompile.suites.suite import load_suite

    if args.suite == "compare":
        if len(args.more) != 2:
            raise UsageError("eval compare takes two eval directories: llmcompile eval compare A B")
        print(report.compare(Path(args.more[0]), Path(args.more[1])))
        return 0
    if args.more:
        raise UsageError(f"unexpected arguments {args.more}; eval takes one SUITE file (or: compare A B)")
    suite = load_suite(args.suite, args.problems)
    if args.target:
        suite = dataclasses.replace(suite, target=get_target(args.target).name)
    opts = EvalOptions(
        llm=args.llm, model=args.model or os.environ.get("LLMCOMPILE_MODEL", ""), base_url=args.base_url or "",
        samples=args.samples,
        rounds=args.rounds, compile_only=args.compile_only, gpus=args.gpus, per_gpu=args.per_gpu, jobs=args.jobs,
        unsafe_no_sandbox=args.unsafe_no_sandbox,
    )  # fmt: skip
    if opts.llm not in ("auto", "openai", "offline"):
        raise UsageError(f"eval takes --llm auto, openai or offline, not {opts.llm!r}")
    if opts.resolved_llm() == "openai" and not opts.model:
        raise UsageError("--llm openai needs --model")
    out = Path(args.out or f"evals/runs/{suite.name}-{suite.target}-{opts.resolved_llm()}")
    if args.backend == "ray":
        from llmcompile.suites.ray_backend import RayEvalRunner, import_ray

        import_ray()  # (says how to install it, before anything is written)
        if args.llm_rate <= 0:
            raise UsageError(f"--llm-rate must be > 0 requests a minute, got {args.llm_rate}")
        runner: EvalRunner = RayEvalRunner(suite, opts, out, address=args.address, llm_rate=args.llm_rate)
    else:
        runner = EvalRunner(suite, opts, out)
    console = Console(stderr=True)
    console.print(f"eval {suite.name}: {len(suite.problems)} problems with {opts.resolved_llm()}; directory {out}")
    if opts.resolved_llm() == "offline":
        console.print(
            "offline: no LLM is used; custom (KernelBench-file) problems are matched to kernel templates, "
            "and those matching none are recorded as not attempted"
        )
    from llmcompile.doctor import bytecode_advice, uncompiled

    if gaps := uncompiled():  # (each problem's processes pay it again: say so once, up front)
        console.print(f"note: {bytecode_advice(gaps)}")
    if gone := runner.gone():
        console.print(
            f"note: {len(gone)} problem(s) recorded done have no run directory left, run again: {', '.join(gone)}"
        )
    total = len(suite.problems)
    done = [total - len(runner.todo())]
    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console, transient=False
    ) as bar:
        overall = bar.add_task(f"problems {done[0]}/{total}")
        lanes: dict[str, int] = {}

        def show(slot: str, pid: str, line: str) -> None:
            if slot not in lanes:
                lanes[slot] = bar.add_task("")
            bar.update(lanes[slot], description=f"  {slot} {pid}: {line[:100]}")
            if line.startswith("= "):
                done[0] += 1
                bar.update(overall, description=f"problems {done[0]}/{total}")
                bar.console.print(f"{pid}: {line[2:]}")

        try:
            pending = runner.run(show)
        except KeyboardInterrupt:
            report.write(out, runner.records())
            console.print(f"interrupted; rerun the same command to resume ({out})")
            return 130
    paths = report.write(out, runner.records())
    print(report.markdown(report.load(out)))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    if pending:
        console.print(f"{pending} problem(s) not finished (pending, or the judge failed): rerun the same command")
    return 0 if not pending else 1


def cmd_coverage(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from llmcompile.agent import coverage

    dtypes = tuple(dtype_name(d) for d in args.dtype)
    with Progress(transient=True) as bar:
        task = bar.add_task("forms put to the matcher", total=coverage.count(dtypes))
        cells = coverage.survey(dtypes, lambda i: bar.update(task, completed=i))
    print(coverage.table(cells), end="")
    if args.out:
        Path(args.out).write_text(coverage.document(cells))
    if args.readme:
        Path(args.readme).write_text(coverage.readme(Path(args.readme).read_text(), cells))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from llmcompile.runtime import export
    from llmcompile.runtime.artifact import ArtifactError

    out = Path(args.out)
    try:
        if Path(args.source).exists():
            if args.n or args.dtype:
                raise UsageError("--dtype and --n choose what to compile for an OP; a run's kernel has its own")
            man = export.export_run(Path(args.source), out)
        else:
            man = export.export_op(args.source, args.dtype or "bfloat16", args.n or [], out)
    except ArtifactError as e:
        print(f"llmcompile: cannot export: {e}", file=sys.stderr)
        return 1
    ns = ", ".join(sorted(man.symbols, key=int))
    print(f"exported {man.op} ({man.dtype}, N = {ns}) to {out}: {man.library} and manifest.json")
    print(f"  from torch, without CuTe DSL: from llmcompile.loader import load; fn = load({str(out)!r})")
    print(
        f'  from C++ (TVM-FFI): Module::LoadFromFile("{out / man.library}"), functions {", ".join(man.symbols.values())}'
    )
    return 0


def _llm_args(s: argparse.ArgumentParser, choices: str) -> None:
    s.add_argument("--llm", default="auto", help=choices)
    s.add_argument("--model", help="model name for --llm openai (or LLMCOMPILE_MODEL)")
    s.add_argument("--base-url", help="OpenAI-compatible endpoint (default: OPENAI_BASE_URL, else OpenAI)")


def _at_least(low: int):
    """An argparse type: an integer >= `low` (0 rounds or -1 samples is a typo, not a run)."""

    def parse(text: str) -> int:
        if not text.lstrip("-").isdigit() or int(text) < low:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= {low}")
        return int(text)

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llmcompile", description="An agent that writes CuTe-DSL GPU kernels near the memory speed of light."
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    s = sub.add_parser("list", help="the ops and targets llmcompile knows")
    s.add_argument("problems", nargs="*", help="KernelBench-format files or directories (default: ./evals/problems)")
    s.set_defaults(fn=cmd_list)

    s = sub.add_parser("doctor", help="check Python, torch, CuTe DSL, GPU and LLM endpoint, with advice")
    s.set_defaults(fn=cmd_doctor)

    s = sub.add_parser("run", help="the agent: write a kernel for OP (same as `llmcompile OP ...`)")
    s.add_argument("op", nargs="?", help="a built-in op or a KernelBench-format .py file")
    run = RunRequest()  # (its defaults are the flags')
    s.add_argument("--target", default=run.target)
    s.add_argument("--dtype", help="default: bfloat16 where the op takes it")
    _llm_args(s, "auto (default), openai, offline or replay")
    s.add_argument("--replay", help="RUN_DIR whose transcript answers (with --llm replay)")
    s.add_argument("--samples", type=_at_least(1), default=run.samples, help="candidates per round")
    s.add_argument("--rounds", type=_at_least(1), default=run.rounds)
    s.add_argument(
        "--max-tokens", type=_at_least(0), default=run.max_tokens, help="token budget for the whole run (0: none)"
    )
    s.add_argument("--max-tokens-per-answer", type=_at_least(1), default=run.max_tokens_per_answer)
    s.add_argument("--time", type=float, default=run.time, help="wall-time budget in seconds (0: none)")
    s.add_argument("--target-sol", type=float, default=run.target_sol, help="stop at this %% of SOL on every shape")
    s.add_argument("--compile-only", action="store_true", help="static + compile only (no GPU needed)")
    s.add_argument("--shapes", help="benchmark shapes, comma-separated MxN (default: the op's own)")
    s.add_argument(
        "--baselines",
        default=run.baselines,
        help=f"timed beside the best at the end ({ATTENTION_BASELINES} for attention)",
    )
    s.add_argument("--out", help="run directory (default: RUNS_DIR/<op>-<target>-<time>)")
    s.add_argument("--runs-dir", default=run.runs_dir)
    s.add_argument("--resume", help="continue an interrupted run from its directory")
    s.add_argument(
        "--unsafe-no-sandbox",
        action="store_true",
        help="run candidate code without the OS sandbox where none can start (recorded in the run)",
    )
    s.set_defaults(fn=cmd_run)

    s = sub.add_parser(
        "check",
        help="judge a kernel file: static check, compile, verify, profile",
        description="Exit code: 0 accepted, 1 rejected, 2 bad usage, 3 stopped after compile (no GPU).",
    )
    s.add_argument("kernel", help="a kernel-contract module (.py)")
    s.add_argument("--op", required=True, help="a built-in op or a KernelBench-format .py file")
    s.add_argument("--target", default=DEFAULT_TARGET)
    s.add_argument("--dtype", help="default: the op's first dtype")
    s.add_argument("--shapes", help="profile shapes, comma-separated MxN (default: the op's benchmark shapes)")
    s.add_argument("--stages", default="static,compile,verify,profile")
    s.add_argument("--baselines", default="none", help="comma list of eager,compile,quack,liger")
    s.add_argument("--json", action="store_true", help="print the verdict as JSON")
    s.add_argument(
        "--unsafe-no-sandbox",
        action="store_true",
        help="run candidate code without the OS sandbox where none can start (recorded in the run)",
    )
    s.set_defaults(fn=cmd_check)

    s = sub.add_parser("bench", help="time the reference kernels against SOL and baselines (needs the GPU)")
    s.add_argument("ops", nargs="+", help=f"ops to time, or 'all' ({', '.join(BUILTIN)})")
    s.add_argument("--target", default=DEFAULT_TARGET)
    s.add_argument("--dtype", nargs="+", default=["bfloat16", "float32"])
    s.add_argument(
        "--shapes", help="comma-separated MxN list (default: 2^28 elements at N in " + ",".join(map(str, BENCH_N)) + ")"
    )
    s.add_argument("--elems", type=int, default=BENCH_ELEMS, help="elements per input for the default grid")
    s.add_argument("--small", action="store_true", help=f"QuACK's small-tensor grid: M={SMALL_M}, N in {SMALL_N}")
    s.add_argument(
        "--baselines", default="eager,compile,quack,liger", help="comma list of eager,compile,quack,liger or 'none'"
    )
    s.add_argument(
        "--no-graph", action="store_true", help="time eager calls (host time included), not CUDA graph replays"
    )
    s.add_argument(
        "--rounds",
        type=_at_least(1),
        default=1,
        help="time the implementations in turn this many times and keep each one's median round",
    )
    s.add_argument(
        "--train",
        action="store_true",
        help="time training steps (forward and backward through autograd) of "
        "softmax, log_softmax, rmsnorm, layernorm, cross_entropy",
    )
    s.add_argument(
        "--processes",
        type=int,
        default=1,
        help="run the bench this many times, each in a fresh process with its own table, "
        "then tabulate each ratio's spread across them (STEM-spread.md)",
    )
    s.add_argument(
        "--before",
        metavar="DIR",
        help="with --processes K: K more processes running the llmcompile in DIR (a copy of another "
        "version's tree), alternating with this one's; STEM-spread.md compares each point's medians",
    )
    s.add_argument("--out", default="bench-results")
    s.add_argument("--stem", default="bench")
    s.set_defaults(fn=cmd_bench)

    s = sub.add_parser(
        "eval",
        help="run the agent over a suite of problems and report metrics (or: eval compare A B)",
        description="Rerun with the same --out to resume. `llmcompile eval compare A B` puts two evals side by side.",
    )
    s.add_argument("suite", help="a suite file (e.g. evals/suites/membound.toml), or 'compare'")
    s.add_argument("more", nargs="*", help="with compare: the two eval directories")
    _llm_args(s, "auto (default), openai or offline")
    s.add_argument("--target", help="run the suite for this target instead of the one it names")
    s.add_argument("--samples", type=_at_least(1), help="candidates per round (default: the suite's budget)")
    s.add_argument("--rounds", type=_at_least(1), help="rounds per problem (default: the suite's budget)")
    s.add_argument("--gpus", default="all", help="'all' or how many GPUs to run on")
    s.add_argument(
        "--per-gpu", type=_at_least(1), default=2,
        help="problems at once on each GPU (default 2): the next starts up while one judges; "
        "they verify and time in turn, never at once",
    )  # fmt: skip
    s.add_argument("--jobs", type=_at_least(1), default=1, help="problems at once with --compile-only (no GPU)")
    s.add_argument("--compile-only", action="store_true", help="static + compile only (no GPU needed)")
    s.add_argument("--problems", help="a directory of KernelBench-format files, in place of the suite's `dir`")
    s.add_argument("--out", help="eval directory (default: evals/runs/<suite>-<target>-<llm>)")
    s.add_argument(
        "--backend", choices=("local", "ray"), default="local",
        help="local: agent processes on this host's GPUs (--per-gpu each); ray: one Ray task per problem on a cluster "
        "(pip install 'llmcompile[ray]')",
    )  # fmt: skip
    s.add_argument(
        "--address", default="auto",
        help="with --backend ray: the cluster (auto: the running one; local: start one of this host; ray://host:port)",
    )  # fmt: skip
    s.add_argument(
        "--llm-rate", type=float, default=120.0,
        help="with --backend ray: LLM requests a minute, shared by every worker of the cluster",
    )  # fmt: skip
    s.add_argument(
        "--unsafe-no-sandbox",
        action="store_true",
        help="run candidate code without the OS sandbox where none can start (recorded in the run)",
    )
    s.set_defaults(fn=cmd_eval)

    s = sub.add_parser(
        "export",
        help="write a kernel as a shared library + manifest that loads without CuTe DSL",
        description="SOURCE: a built-in op (its reference kernel, compiled for --dtype at each --n) or a run "
        "directory (its best kernel). Exit code: 0 written, 1 cannot be exported, 2 bad usage.",
    )
    s.add_argument("source", help="a built-in op or a run directory (RUN_DIR, RUN_DIR/best or an artifact)")
    s.add_argument("--out", required=True, help="the artifact directory to write")
    s.add_argument("--dtype", help="with an op: the dtype (default bfloat16)")
    s.add_argument("--n", type=int, nargs="+", help="with an op: the row lengths N to compile for")
    s.set_defaults(fn=cmd_export)

    s = sub.add_parser(
        "coverage",
        help="what the offline default takes: every torch reduction along every dim, and other forms",
        description="Each form is written as a small KernelBench-format problem and put to the matcher (no GPU).",
    )
    s.add_argument("--dtype", nargs="+", default=["float32", "bfloat16", "float16"], help="the dtypes to try")
    s.add_argument("--out", help="also write the table, with what it is, to this file (docs/coverage.md)")
    s.add_argument("--readme", help="also write the count between the coverage markers of this file (README.md)")
    s.set_defaults(fn=cmd_coverage)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and not argv[0].startswith("-") and argv[0] not in COMMANDS:
        argv.insert(0, "run")  # `llmcompile softmax --target h100` is the main job
    args = parser.parse_args(argv)
    args.argv = argv  # (what `bench --processes` runs again in each child)
    if getattr(args, "fn", None) is cmd_run and not args.op and not args.resume:
        parser.error("run needs an OP (or --resume RUN_DIR)")
    if not getattr(args, "fn", None):
        parser.print_help()
        return 2
    try:
        return args.fn(args)
    except (OpError, TargetError, UsageError, SuiteError) as e:
        print(f"llmcompile: error: {e}", file=sys.stderr)
        return 2
    except (JudgeFailure, SandboxUnavailable) as e:  # the judge's own trouble, never a candidate's verdict
        print(f"llmcompile: the judge could not run: {e}", file=sys.stderr)
        return JUDGE_FAILED_RC
    except KeyboardInterrupt:
        print("llmcompile: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
