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
    baselines = [] if args.baselines == "none" else args.baselines.split(",")
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llmcompile", description="An agent that writes CuTe-DSL GPU kernels near the memory speed of light."
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    s = sub.add_parser("list", help="the ops and targets llmcompile knows")
    s.set_defaults(fn=cmd_list)

    s = sub.add_parser("doctor", help="check Python, torch, CuTe DSL, GPU and LLM endpoint, with advice")
    s.set_defaults(fn=cmd_doctor)

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
