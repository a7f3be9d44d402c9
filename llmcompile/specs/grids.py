"""The shapes ops are benchmarked and verified at (M rows of N: N fixed at compile time)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from llmcompile.specs.errors import OpError

if TYPE_CHECKING:
    from llmcompile.specs.types import OpSpec

# Benchmark grid of the foundation issue: 2^28 elements per input, N from 1k to 262k.
BENCH_N = (1024, 4096, 16384, 65536, 131072, 262144)
BENCH_ELEMS = 1 << 28
SMALL_M = 32768
SMALL_N = (256, 512, 1024, 2048)


def parse_shape(text: str) -> tuple[int, int]:
    """'32768x4096' -> (32768, 4096); OpError on anything else."""
    try:
        m, n = (int(v) for v in str(text).lower().split("x"))
    except ValueError:
        raise OpError(f"bad shape {text!r}: write MxN, e.g. 32768x4096") from None
    if m < 1 or n < 1:
        raise OpError(f"bad shape {text!r}: M and N must be at least 1")
    return m, n


def bench_shapes(elems: int = BENCH_ELEMS) -> list[tuple[int, int]]:
    return [(elems // n, n) for n in BENCH_N]


# Verification grid for row ops: the benchmark N plus held-out N the prompt never shows
# (not multiples of 8 or of a power of two), each at M = 1, an odd M, and a large odd M.
HELD_OUT_N = (256, 5000, 5001, 128256)
VERIFY_ELEMS = 1 << 22  # elements per tensor at the largest verified M


def verify_shapes(spec: OpSpec, ns: list[int] | None = None) -> list[tuple[int, int]]:
    if spec.fixed_shapes:
        out = []
        row = max(1, torch.Size(spec.tensors[0].shape(1, 1)).numel())  # a fixed problem's N is in its dims
        for m0, n in spec.fixed_shapes:
            # the large M holds a few million elements per tensor, however large the problem
            big = min(m0, max(3, VERIFY_ELEMS // row) | 1)
            out += [(1, n), (max(1, (big // 2) | 1), n), (big, n)] if spec.batchable else [(m0, n)]
        return sorted(set(out) | set(spec.extra_verify))
    out = []
    for n in sorted(set(ns or [n for _, n in spec.shapes()] + list(HELD_OUT_N))):
        big = max(133, (VERIFY_ELEMS // n) | 1)  # more rows than SMs, ~4M elements
        out += [(1, n), (3, n), (big, n)]
    return out
