"""The `llmcompile` command. Thin: every subcommand is a call into the modules."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from llmcompile.ops import BENCH_N, BUILTIN, SMALL_M, SMALL_N, OpError, bench_shapes, dtype_name
from llmcompile.targets import TARGETS, TargetError, get_target, require_gpu


class UsageError(Exception):
    pass


def cmd_list(args: argparse.Namespace) -> int:
    print("ops:")
    for s in BUILTIN.values():
        ins = ", ".join(t.name for t in s.inputs)
        outs = ", ".join(t.name for t in s.outputs)
        sc = ", ".join(f"{k}={v}" for k, v in s.scalars.items())
        print(f"  {s.name:14s} {s.summary}  [{ins} -> {outs}{'; ' + sc if sc else ''}]")
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


def _parse_shapes(text: str | None) -> list[tuple[int, int]] | None:
    if not text:
        return None
    out = []
    for part in text.split(","):
        try:
            m, n = part.lower().split("x")
            out.append((int(m), int(n)))
        except ValueError:
            raise UsageError(f"bad shape {part!r}: write MxN, e.g. 32768x4096") from None
    return out


def cmd_bench(args: argparse.Namespace) -> int:
    from llmcompile import bench
    from llmcompile.kernels import BY_NAME

    target = get_target(args.target)
    require_gpu(target)
    ops = [o for o in BUILTIN if o != "copy"] if args.ops == ["all"] else args.ops
    for op in ops:
        if op not in BUILTIN:
            raise OpError(f"unknown op {op!r}; known ops: {', '.join(sorted(BUILTIN))}")
    dtypes = [dtype_name(d) for d in args.dtype]
    if args.small:
        shapes = [(SMALL_M, n) for n in SMALL_N]
    else:
        shapes = _parse_shapes(args.shapes) or bench_shapes(args.elems)
    baselines = _baselines(args.baselines)
    copy = BY_NAME["copy"]
    result = bench.run(
        ops,
        dtypes,
        shapes,
        baselines,
        dict(BY_NAME),
        copy_kernel=lambda dst, src: copy.compiled("bfloat16", src.shape[1])(src, dst),
    )
    paths = bench.write(result, Path(args.out), args.stem)
    print(bench.markdown(result))
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
        res = ", ".join(f"{k.registers} regs/{k.spill_store_bytes} B spill" for k in c.kernels[:2])
        lines.append(f"compile  {'ok' if c.ok else 'FAILED'} ({c.seconds:.1f} s, N={c.n}) {res}")
    if v.verify:
        r = v.verify
        lines.append(
            f"verify   {'ok' if r.ok else 'FAILED'}: {r.runs} checked runs, {len(r.shapes)} shapes ({r.seconds:.1f} s)"
        )
    if v.profile:
        lines.append(
            f"profile  {'ok' if v.profile.ok else 'FLAGGED'}: device copy {v.profile.sol_tbs:.3f} TB/s, "
            f"read-only {v.profile.read_tbs:.3f} TB/s"
        )
    return lines


def _profile_table(v) -> str:
    if not v.profile:
        return ""
    impls = sorted({k for s in v.profile.shapes for k in s.baselines})
    head = "| M | N | ms | TB/s | % SOL | " + " | ".join(f"{i} TB/s" for i in impls) + " |"
    out = [head, "|---" * (5 + len(impls)) + "|"]
    for s in v.profile.shapes:
        cells = " | ".join(f"{s.baselines[i]:.2f}" if i in s.baselines else "n/a" for i in impls)
        out.append(f"| {s.m} | {s.n} | {s.ms:.4f} | {s.tbs:.3f} | {s.pct_sol:.1f} | {cells} |")
    return "\n".join(out)


def cmd_check(args: argparse.Namespace) -> int:
    import json

    from llmcompile.harness import STAGES, Judge, JudgeOptions
    from llmcompile.ops import get_op

    path = Path(args.kernel)
    if not path.is_file():
        raise UsageError(f"no such kernel file: {path}")
    spec = get_op(args.op)
    dtype = dtype_name(args.dtype) if args.dtype else spec.dtypes[0]
    target = get_target(args.target)
    stages = tuple(s for s in STAGES if s in args.stages.split(","))
    opts = JudgeOptions(stages=stages, profile_shapes=_parse_shapes(args.shapes), baselines=_baselines(args.baselines))
    with Judge(target.name) as judge:
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


def _baselines(text: str) -> list[str]:
    return [] if text in ("", "none") else text.split(",")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llmcompile", description="An agent that writes CuTe-DSL GPU kernels near the memory speed of light."
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    s = sub.add_parser("list", help="the ops and targets llmcompile knows")
    s.set_defaults(fn=cmd_list)

    s = sub.add_parser("doctor", help="check Python, torch, CuTe DSL, GPU and LLM endpoint, with advice")
    s.set_defaults(fn=cmd_doctor)

    s = sub.add_parser(
        "check",
        help="judge a kernel file: static check, compile, verify, profile",
        description="Exit code: 0 accepted, 1 rejected, 2 bad usage, 3 stopped after compile (no GPU).",
    )
    s.add_argument("kernel", help="a kernel-contract module (.py)")
    s.add_argument("--op", required=True, help="a built-in op or a KernelBench-format .py file")
    s.add_argument("--target", default="h100")
    s.add_argument("--dtype", help="default: the op's first dtype")
    s.add_argument("--shapes", help="profile shapes, comma-separated MxN (default: the op's benchmark shapes)")
    s.add_argument("--stages", default="static,compile,verify,profile")
    s.add_argument("--baselines", default="none", help="comma list of eager,compile,quack,liger")
    s.add_argument("--json", action="store_true", help="print the verdict as JSON")
    s.set_defaults(fn=cmd_check)

    s = sub.add_parser("bench", help="time the reference kernels against SOL and baselines (needs the GPU)")
    s.add_argument("ops", nargs="+", help=f"ops to time, or 'all' ({', '.join(BUILTIN)})")
    s.add_argument("--target", default="h100")
    s.add_argument("--dtype", nargs="+", default=["bfloat16", "float32"])
    s.add_argument(
        "--shapes", help="comma-separated MxN list (default: 2^28 elements at N in " + ",".join(map(str, BENCH_N)) + ")"
    )
    s.add_argument("--elems", type=int, default=1 << 28, help="elements per input for the default grid")
    s.add_argument("--small", action="store_true", help=f"QuACK's small-tensor grid: M={SMALL_M}, N in {SMALL_N}")
    s.add_argument(
        "--baselines", default="eager,compile,quack,liger", help="comma list of eager,compile,quack,liger or 'none'"
    )
    s.add_argument("--out", default="bench-results")
    s.add_argument("--stem", default="bench")
    s.set_defaults(fn=cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "fn", None):
        parser.print_help()
        return 2
    try:
        return args.fn(args)
    except (OpError, TargetError, UsageError) as e:
        print(f"llmcompile: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("llmcompile: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
