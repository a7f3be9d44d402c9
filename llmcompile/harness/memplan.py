"""How much GPU memory each GPU stage needs, known before anything is allocated.

The judge asks this before verifying or profiling: a problem that cannot fit the GPU ends with a
plain `ProblemTooLarge` ("needs 34.0 GiB, the GPU has 79.1 GiB"), never with an out-of-memory
crash that would read as the candidate's fault. The counts follow what `gpu_stages` and `bench`
allocate; they err high (a margin for the allocator and the baselines' own workspaces).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmcompile.harness.verify import CHUNK_ELEMS, rows_independent
from llmcompile.specs import OpError, OpSpec

GIB = 1 << 30
MARGIN = 1.15  # allocator rounding and fragmentation
RESERVE = 1 * GIB  # CUDA context, the copy probe, torch's own workspaces
H200_BYTES = 139 * GIB  # the largest GPU a target names
L2_ROTATION_BYTES = 4 * (50 << 20)  # timing.rotation_count's cold-L2 working set on an H100/H200


class ProblemTooLarge(OpError):
    """The problem, at the asked sizes, needs more GPU memory than the GPU has."""


@dataclass(frozen=True)
class StagePlan:
    stage: str
    m: int
    n: int
    bytes: int
    least: int = 0  # what it can make do with (a profile on one input set); 0: `bytes`

    @property
    def at_least(self) -> int:
        return self.least or self.bytes

    def describe(self) -> str:
        return f"{self.stage} at M={self.m} N={self.n} needs {self.at_least / GIB:.1f} GiB"


def _reference_bytes(spec: OpSpec, dtype: str, m: int, n: int, chunked: bool) -> int:
    """The float64 reference: inputs and outputs upcast, the reference's outputs, the comparison.
    (torch's own run in the problem's dtype comes first and keeps only its outputs: its
    temporaries are gone before the reference's, and in half the bytes or less.)"""
    # the outputs twice more: the reference on the inputs' magnitudes and on the inputs moved
    # by u |x| (verify.compare's slack)
    outs = sum(math.prod(t.shape(m, n)) for t in spec.outputs)
    elems = sum(math.prod(t.shape(m, n)) for t in spec.tensors) + 2 * outs
    if chunked:
        row = max(1, math.prod(spec.tensors[0].shape(1, n)))
        elems = min(elems, max(CHUNK_ELEMS, row) * (len(spec.tensors) + 2 * len(spec.outputs)))
    return elems * 8 * 3 + spec.reference_scratch


def verify_bytes(spec: OpSpec, dtype: str, m: int, n: int) -> int:
    """Inputs made, copied into guarded buffers and kept for comparison; outputs and a copy of
    them for the repeat check; the float64 reference of the whole shape."""
    moved = spec.bytes_moved(m, n, dtype)
    return int(MARGIN * (4 * moved + _reference_bytes(spec, dtype, m, n, chunked=False)))


def profile_bytes(spec: OpSpec, dtype: str, m: int, n: int, least: bool = False) -> int:
    """The rotated input sets (at least two, so outputs rotate against them; with `least`, the one
    set a problem too large for two is timed on) with an output set each,
    plus the check of the timed outputs (in chunks of rows where rows are independent; else in
    chunks against torch's own output, the whole float64 reference being used only where the
    free memory allows it at the time) and one set of outputs a baseline allocates."""
    moved = spec.bytes_moved(m, n, dtype)
    sets = 1 if least else max(2, min(64, -(-L2_ROTATION_BYTES // max(moved, 1))))
    outs = sum(
        math.prod(t.shape(m, n)) * (8 if (t.dtype or dtype) in ("float64", "int64") else 4) for t in spec.outputs
    )
    if rows_independent(spec):
        check = _reference_bytes(spec, dtype, m, n, chunked=True)
    else:  # against torch's own output: its outputs and temporaries, then chunks in float64
        check = moved + CHUNK_ELEMS * 8 * 3
    return int(MARGIN * (sets * moved + outs + check))


def plan(
    spec: OpSpec, dtype: str, verify_shapes: list[tuple[int, int]], profile_shapes: list[tuple[int, int]]
) -> list[StagePlan]:
    return [StagePlan("verify", m, n, verify_bytes(spec, dtype, m, n)) for m, n in verify_shapes] + [
        StagePlan("profile", m, n, profile_bytes(spec, dtype, m, n), profile_bytes(spec, dtype, m, n, least=True))
        for m, n in profile_shapes
    ]


def check_fits(plans: list[StagePlan], gpu_bytes: int, gpu_name: str = "the GPU") -> None:
    """Raise ProblemTooLarge naming the largest stage that does not fit in `gpu_bytes`."""
    worst = max(plans, key=lambda p: p.at_least, default=None)
    if worst is not None and worst.at_least + RESERVE > gpu_bytes:
        bigger = " or on an H200 (--target h200)" if worst.at_least + RESERVE <= H200_BYTES else ""
        raise ProblemTooLarge(
            f"{worst.describe()}; {gpu_name} has {gpu_bytes / GIB:.1f} GiB. Judge it at smaller shapes (--shapes){bigger}"
        )
