"""Time reference-kernel variants over their tuning knobs (GPU), to fill the limit tables.

    python -m evals.sweep_knobs layernorm bfloat16 1024x262144 '{}' '{"threads_per_row": 256}'

    python -m evals.sweep_knobs attention_causal bfloat16 64x4096 '{}' '{"head_group": 0}' fa4 sdpa_cudnn

Each knob set is a JSON object of RowKnobs fields (AttentionKnobs for attention); '{}' is the
default table's choice; a baseline's name (quack, fa4, sdpa_cudnn, ...: llmcompile.baselines)
times that kernel on the same inputs, in the same process. Rates are TB/s against the copy
bandwidth, or for a compute-bound op TFLOP/s against the dense GEMM probe, both measured first.
Every variant of ours is verified against the float64 reference before it is timed. A key
"table:MODULE.NAME" replaces a limit table of reference_kernels.MODULE for that variant only
(a knob the tables hold and RowKnobs does not): '{"table:rmsnorm_bwd.CTAS_PER_SM": [[null, 2]]}'.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import sys
from collections.abc import Iterator
from typing import Any

import torch

from llmcompile import baselines, timing
from llmcompile.bench import DTYPES, input_sets
from llmcompile.kernels import KernelFunction, compiler_of, reference_function
from llmcompile.ops import OpSpec, get_op
from llmcompile.verify import compare, poison
from reference_kernels.reduce import RowKnobs


def main(argv: list[str]) -> int:
    op, dtype, shapes, *knob_sets = argv
    spec = get_op(op)
    if spec.compute_bound:
        sol = timing.gemm_tflops(DTYPES[dtype])
        print(f"dense GEMM probe {sol:.0f} TFLOP/s")
    else:
        sol = max(timing.copy_bandwidths().values())
        print(f"torch copy SOL {sol:.3f} TB/s")
    unit = spec.unit
    for shape in shapes.split(","):
        m, n = (int(v) for v in shape.split("x"))
        work = spec.work(m, n, dtype)
        sets = input_sets(spec, m, n, dtype)
        for ks in knob_sets or ["{}"]:
            if ks in baselines.BASELINES:
                try:
                    calls = [baselines.BASELINES[ks](spec, list(s), dict(spec.scalars)) for s in sets]
                    rate = timing.tbs(work, timing.time_calls(calls).median_ms)
                except Exception as e:  # noqa: BLE001 - a baseline that cannot run is reported
                    print(f"{op} {dtype} {m}x{n} {ks}: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
                    continue
                print(f"{op} {dtype} {m}x{n} {ks:45s} {rate:.3f} {unit} {100 * rate / sol:5.1f}%")
                continue
            fields = json.loads(ks)
            tables = {k.removeprefix("table:"): v for k, v in fields.items() if k.startswith("table:")}
            fn = _variant(spec, {k: v for k, v in fields.items() if not k.startswith("table:")})
            try:
                with _tables(tables):  # (read while the kernel is traced, i.e. compiled)
                    kernel = fn.compiled(dtype, n)
            except Exception as e:  # noqa: BLE001 - an invalid variant is reported and skipped
                print(f"{op} {dtype} {m}x{n} {ks}: does not compile: {str(e).splitlines()[0][:120]}")
                continue
            outs = spec.alloc_outputs(m, n, dtype, "cuda")
            poison(outs)
            kernel(*sets[0], *outs, *spec.scalars.values())
            bad = compare(spec, dtype, sets[0], outs)
            timing.settle()  # (float64 work lowers the clocks for seconds: time after they recover)
            outsets = [spec.alloc_outputs(m, n, dtype, "cuda") for _ in sets]
            calls = [lambda s=s, o=o, k=kernel: k(*s, *o, *spec.scalars.values()) for s, o in zip(sets, outsets)]
            rate = timing.tbs(work, timing.time_calls(calls).median_ms)
            verdict = "ok" if bad is None else "WRONG: " + bad.describe()
            print(f"{op} {dtype} {m}x{n} {ks:45s} {rate:.3f} {unit} {100 * rate / sol:5.1f}% {verdict}")
        del sets
        torch.cuda.empty_cache()
    return 0


def _variant(spec: OpSpec, fields: dict) -> KernelFunction:
    if not spec.compute_bound:
        return reference_function(spec.name, RowKnobs(**fields))
    return KernelFunction(spec, compiler_of(spec, _attention_entry(spec, fields)))


def _attention_entry(spec: OpSpec, fields: dict) -> Any:
    from reference_kernels.attention import Attention, AttentionKnobs

    # (attention's entry takes its causality beside the knobs)
    return Attention(causal=spec.causal, knobs=AttentionKnobs(**fields))


@contextlib.contextmanager
def _tables(tables: dict[str, list]) -> Iterator[None]:
    saved = []
    try:
        for name, rows in tables.items():
            module, attr = name.rsplit(".", 1)
            mod = importlib.import_module(f"reference_kernels.{module}")
            saved.append((mod, attr, getattr(mod, attr)))
            setattr(mod, attr, tuple(tuple(r) for r in rows))
        yield
    finally:
        for mod, attr, old in reversed(saved):
            setattr(mod, attr, old)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
