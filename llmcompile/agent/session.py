"""One agent run for one problem, set up from plain options (`RunRequest`): the judge started
first, so its processes come up while the problem loads; the provider; the run directory; the
loop (`loop.run_agent`); the end (`report.finalize`). `llmcompile run` (and every agent process
of an eval) is a call of `run_problem`; the CLI only parses arguments."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmcompile.agent.providers import Provider
    from llmcompile.specs import OpSpec


class UsageError(Exception):
    """What the user asked for cannot be done as asked (the CLI exits 2 and says why)."""


RUN_BASELINES = "eager,compile,quack,liger"  # the row ops' peers
ATTENTION_BASELINES = "sdpa_flash,sdpa_cudnn,fa4"  # a compute-bound op's peers (bench: sdpa_efficient too)


def default_baselines(spec: OpSpec, text: str) -> str:
    return ATTENTION_BASELINES if text == RUN_BASELINES and spec.compute_bound else text


def parse_shapes(text: str | None) -> list[tuple[int, int]] | None:
    from llmcompile.specs import parse_shape

    return [parse_shape(s) for s in text.split(",")] if text else None


@dataclass
class RunRequest:
    """What `llmcompile run` takes (its flags, by name)."""

    op: str | None = None
    target: str = "h100"  # specs.targets.DEFAULT_TARGET (llmcompile.specs imports torch: not here)
    dtype: str | None = None
    llm: str = "auto"
    model: str = ""
    base_url: str | None = None
    replay: str | None = None
    samples: int = 4
    rounds: int = 6
    max_tokens: int = 0
    max_tokens_per_answer: int = 8192
    time: float = 0.0
    target_sol: float = 90.0
    compile_only: bool = False
    baselines: str = RUN_BASELINES
    shapes: str | None = None
    out: str | None = None
    runs_dir: str = "runs"
    resume: str | None = None
    unsafe_no_sandbox: bool = False


def make_provider(
    args: RunRequest, spec: OpSpec, dtype: str, shapes: list[tuple[int, int]] | None = None
) -> tuple[Provider, str]:
    """--llm auto: the OpenAI-compatible endpoint when a model and key are configured, else the
    offline search (which says so)."""
    import os

    from llmcompile.agent.offline import offline_provider
    from llmcompile.agent.providers import OpenAIProvider, ReplayProvider, choose_llm

    model = args.model or os.environ.get("LLMCOMPILE_MODEL", "")
    llm = choose_llm(args.llm, model)
    if llm == "openai":
        if not model:
            raise UsageError("--llm openai needs --model (or LLMCOMPILE_MODEL)")
        return OpenAIProvider(model, args.base_url, max_tokens=args.max_tokens_per_answer), model
    if llm == "replay":
        if not args.replay:
            raise UsageError("--llm replay needs --replay RUN_DIR")
        return ReplayProvider(args.replay), ""
    if llm == "offline":
        return offline_provider(spec, dtype, shapes), ""
    raise UsageError(f"unknown --llm {llm!r}: auto, openai, offline or replay")


def run_problem(args: RunRequest) -> int:
    """One run, start to end: the problem, its provider, the judge, the loop, the report (0: a
    best kernel; 1: none; 130: interrupted, resumable)."""
    from rich.console import Console

    from llmcompile.agent.loop import run_agent
    from llmcompile.agent.providers import ProviderError
    from llmcompile.agent.report import finalize, summary_table
    from llmcompile.agent.runs import RunConfig, RunStore, config_dict, new_run_dir, process_started
    from llmcompile.bench.baselines import parse_baselines
    from llmcompile.harness import Judge, gpu_available
    from llmcompile.specs import dtype_name, get_op
    from llmcompile.specs.targets import TargetError, get_target, require_gpu

    console = Console(stderr=True)
    resumed = RunStore(Path(args.resume)) if args.resume else None
    first = resumed.config() if resumed else None
    target = get_target(first.target if first else args.target)
    compile_only = first.compile_only if first else args.compile_only
    if first is None and not Path(args.op or "").is_file():
        get_op(args.op or "")  # an unknown op or a missing file is said first (a problem file loads beside the judge)
    if not compile_only:
        if not gpu_available():
            raise TargetError(
                f"verifying and timing kernels need the target GPU ({target.name}), and no CUDA GPU is visible; "
                "run with --compile-only for compile-only rounds here"
            )
        require_gpu(target)
    unsafe = args.unsafe_no_sandbox or bool(resumed and resumed.sandbox().get("unsafe_no_sandbox"))
    # The judge first: its processes come up (imports, CuTe DSL's first compile, a CUDA context)
    # while the problem loads and the first candidates are written, not in front of them.
    with Judge(target.name, gpu=not compile_only and None, unsafe_no_sandbox=unsafe) as judge:
        if resumed is not None:
            store, cfg = resumed, first
            assert cfg is not None
            spec = get_op(cfg.op)
            if args.replay or args.llm not in ("auto", cfg.provider):
                raise UsageError("--resume continues with the run's own provider and budgets")
            args.llm, args.model, args.base_url = cfg.provider, cfg.model, cfg.base_url or None
        else:
            spec = get_op(args.op)
            dtype = (
                dtype_name(args.dtype) if args.dtype else ("bfloat16" if "bfloat16" in spec.dtypes else spec.dtypes[0])
            )
            cfg = RunConfig(
                op=spec.ref, dtype=dtype, target=args.target, provider="", samples=args.samples, rounds=args.rounds,
                max_tokens=args.max_tokens, time_limit_s=args.time, target_pct=args.target_sol,
                compile_only=args.compile_only, baselines=parse_baselines(default_baselines(spec, args.baselines)),
                replay_from=args.replay or "", shapes=[list(s) for s in parse_shapes(args.shapes) or []],
            )  # fmt: skip
        try:
            provider, model = make_provider(args, spec, cfg.dtype, cfg.profile_shapes())
        except ProviderError as e:
            raise UsageError(str(e)) from None
        if resumed is None:
            cfg.provider, cfg.model, cfg.base_url = provider.name, model, args.base_url or ""
            store = RunStore(Path(args.out) if args.out else new_run_dir(Path(args.runs_dir), spec.name, target.name))
            store.write_json("config.json", config_dict(cfg))
            from llmcompile.bench.grid import versions

            store.write_json("versions.json", versions())
        if not provider.uses_llm:
            console.print(
                f"[bold]{provider.name}[/bold]: no LLM is used in this run"
                + (f" ({getattr(provider, 'describe', lambda: '')()})" if provider.name == "offline" else "")
            )
        console.print(f"run directory: {store.path}")
        store.event("start", at=process_started())

        def show(info: dict) -> None:
            best = info["best"]
            verdicts = ", ".join(f"{k} {v}" for k, v in sorted(info["verdicts"].items())) or "none yet"
            # compile-only rounds time nothing: a best there is one that compiled, with no % to show
            score = "compiled, not timed" if cfg.compile_only else f"{best.min_pct:.1f}% SOL" if best else ""
            console.print(
                f"round {info['round']}/{cfg.rounds} {info['phase']:8s} judged {info['judged']:3d} [{verdicts}] "
                f"best {f'{score} ({best.id})' if best else '-'}"
            )

        store.write_json("sandbox.json", judge.sandbox_facts())
        if judge.turn is not None and judge.turn.error:
            console.print(f"[bold yellow]note[/bold yellow]: {judge.turn.error}")
        if unsafe and not judge.sandbox.layers.namespaces:  # (without the flag the judge refuses, and says why)
            console.print(
                "[bold red]--unsafe-no-sandbox[/bold red]: candidates run WITHOUT isolation (recorded in sandbox.json)"
            )
        try:
            result = run_agent(spec, cfg, provider, judge, store, show)
        except ProviderError as e:
            raise UsageError(f"{e} (everything so far is saved in {store.path}; continue with --resume)") from None
        store.event("judge", **judge.start_facts())
        summary = finalize(store, spec, cfg, result, judge)
    print(summary_table(summary))
    if result.stop_reason.startswith("interrupted"):
        return 130
    return 0 if summary["best"] else 1
