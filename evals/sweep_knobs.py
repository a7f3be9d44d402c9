"""Time reference-kernel variants over their tuning knobs (GPU), to fill the limit tables.

    python -m evals.sweep_knobs layernorm bfloat16 1024x262144 '{}' '{"threads_per_row": 256}'

Each knob set is a JSON object of RowKnobs fields; '{}' is the default table's choice; 'quack'
times QuACK's kernel on the same inputs, in the same process. Every variant of ours is verified
against the float64 reference before it is timed. A key "table:MODULE.NAME" replaces a limit
table of reference_kernels.MODULE for that variant only (a knob the tables hold and RowKnobs
does not): '{"table:rmsnorm_bwd.CTAS_PER_SM": [[null, 2]]}'.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import sys
from collections.abc import Iterator

import torch

from llmcompile import baselines, timing
from llmcompile.bench import input_sets
from llmcompile.kernels import reference_function
from llmcompile.ops import get_op
from llmcompile.verify import compare, poison
from reference_kernels.reduce import RowKnobs


def main(argv: list[str]) -> int:
    op, dtype, shapes, *knob_sets = argv
    spec = get_op(op)
    copies = timing.copy_bandwidths()
    sol = max(copies.values())
    print(f"torch copy SOL {sol:.3f} TB/s")
    for shape in shapes.split(","):
        m, n = (int(v) for v in shape.split("x"))
        nbytes = spec.bytes_moved(m, n, dtype)
        sets = input_sets(spec, m, n, dtype)
        for ks in knob_sets or ["{}"]:
            if ks == "quack":
                try:
                    calls = [baselines.quack(spec, list(s), dict(spec.scalars)) for s in sets]
                except baselines.Unavailable as e:
                    print(f"{op} {dtype} {m}x{n} quack: {e}")
                    continue
                bw = timing.tbs(nbytes, timing.time_calls(calls).median_ms)
                print(f"{op} {dtype} {m}x{n} {'quack':45s} {bw:.3f} TB/s {100 * bw / sol:5.1f}%")
                continue
            fields = json.loads(ks)
            tables = {k.removeprefix("table:"): v for k, v in fields.items() if k.startswith("table:")}
            knobs = RowKnobs(**{k: v for k, v in fields.items() if not k.startswith("table:")})
            fn = reference_function(op, knobs)
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
            outsets = [spec.alloc_outputs(m, n, dtype, "cuda") for _ in sets]
            calls = [lambda s=s, o=o, k=kernel: k(*s, *o, *spec.scalars.values()) for s, o in zip(sets, outsets)]
            t = timing.time_calls(calls)
            bw = timing.tbs(nbytes, t.median_ms)
            verdict = "ok" if bad is None else "WRONG: " + bad.describe()
            print(f"{op} {dtype} {m}x{n} {ks:45s} {bw:.3f} TB/s {100 * bw / sol:5.1f}% {verdict}")
        del sets
        torch.cuda.empty_cache()
    return 0


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
