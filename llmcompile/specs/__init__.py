"""What an op is, as data: its tensors, inputs, float64 reference, byte model, tolerance and
shapes (`types`, `inputs`, `references`, `grids`); the built-in ops (`builtin`, `attention`);
KernelBench-format problem files loaded into the same type (`kernelbench`); the GPUs targeted
(`targets`); the kernel contract every kernel module follows (`contract`).

The names most callers want are here: `get_op`, `OpSpec`, `BUILTIN`, and the rest below.
"""

from __future__ import annotations

from llmcompile.specs.builtin import BUILTIN, EPS_CASES, IGNORE_CASES
from llmcompile.specs.errors import OpError
from llmcompile.specs.grids import (
    BENCH_ELEMS,
    BENCH_N,
    HELD_OUT_N,
    SMALL_M,
    SMALL_N,
    VERIFY_ELEMS,
    bench_shapes,
    parse_shape,
    verify_shapes,
)
from llmcompile.specs.inputs import GENERIC_CASES, IGNORE_CASE, SPIKE, generic_inputs
from llmcompile.specs.types import (
    DEFAULT_TOL,
    DTYPE_ALIASES,
    DTYPES,
    MAX_ELEMS,
    HasTensors,
    InputMaker,
    OpSpec,
    TensorDesc,
    Tolerance,
    dtype_name,
)

__all__ = [
    "BENCH_ELEMS", "BENCH_N", "BUILTIN", "DEFAULT_TOL", "DTYPES", "DTYPE_ALIASES", "EPS_CASES", "GENERIC_CASES",
    "HELD_OUT_N", "IGNORE_CASE", "IGNORE_CASES", "MAX_ELEMS", "SMALL_M", "SMALL_N", "SPIKE", "VERIFY_ELEMS",
    "HasTensors", "InputMaker", "OpError", "OpSpec", "TensorDesc", "Tolerance", "bench_shapes", "dtype_name",
    "generic_inputs", "get_op", "parse_shape", "verify_shapes",
]  # fmt: skip


def get_op(name: str) -> OpSpec:
    """A built-in op by name, or a custom op from a KernelBench-format file (a path ending .py)."""
    if name.endswith(".py") or "/" in name:
        from llmcompile.specs.kernelbench import load_problem

        return load_problem(name)
    try:
        return BUILTIN[name]
    except KeyError:
        raise OpError(
            f"unknown op {name!r}; known ops: {', '.join(sorted(BUILTIN))}, or a KernelBench-format .py file"
        ) from None
