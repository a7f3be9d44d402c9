"""Stages 3 and 4, on the GPU inside a worker: verify a compiled candidate, then profile it.

Verification assumes the candidate is hostile. Every tensor sits between guard bands
(inputs' guards hold NaN, so reading past an edge poisons the answer; outputs' guards must
be untouched after the call); outputs start as NaN so an unwritten element shows; inputs
must be bit-identical afterwards; a second call on new values at the same addresses,
without re-poisoning, must give the new answer (no caching by pointer, no "skip if already
written"); the large shape is run again to catch races that only sometimes bite.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from llmcompile import bench, timing, verify
from llmcompile.harness.verdict import CheckFailure, ProfileResult, ShapeTiming, VerifyResult
from llmcompile.ops import DTYPES, OpSpec

GUARD_BYTES = 4096
INT_GUARD = 1 << 40  # an index no row has: reading it as a target gives nonsense, not a pass


class CandidateFault(Exception):
    """The candidate broke the CUDA context (illegal address, trap): the worker must go."""


@dataclass
class Guarded:
    view: torch.Tensor
    buf: torch.Tensor
    g: int
    guard: torch.Tensor  # bytes of one guard band as allocated

    def guards_intact(self) -> bool:
        b = self.buf.view(torch.uint8)
        gb = self.g * self.buf.element_size()
        return torch.equal(b[:gb], self.guard) and torch.equal(b[-gb:], self.guard)


def guarded(shape: tuple[int, ...], dtype: torch.dtype, device: str = "cuda") -> Guarded:
    numel = torch.Size(shape).numel()
    esize = torch.empty((), dtype=dtype).element_size()
    g = GUARD_BYTES // esize  # keeps the view 16-byte aligned: torch allocations are 512-aligned
    buf = torch.empty(numel + 2 * g, dtype=dtype, device=device)
    buf.fill_(float("nan") if dtype.is_floating_point else INT_GUARD)
    guard = buf.view(torch.uint8)[: g * esize].clone()
    return Guarded(buf[g : g + numel].view(shape), buf, g, guard)


def device_fault(e: BaseException) -> bool:
    """Whether an exception is a fault a kernel can raise on the device (an illegal address, a
    trap: whatever the CUDA runtime reports). Running out of memory is not one: a kernel
    allocates nothing, so that is the judge's memory plan falling short."""
    text = f"{type(e).__name__} {e}"
    if "OutOfMemory" in text or "out of memory" in text:
        return False
    return isinstance(e, CandidateFault) or any(w in text for w in ("CUDA", "cuda", "illegal"))


def _call(fn: Callable, ins: list[torch.Tensor], outs: list[torch.Tensor], scalars: list) -> None:
    try:
        fn(*ins, *outs, *scalars)
        torch.cuda.synchronize()
    except Exception as e:
        if device_fault(e):
            raise CandidateFault(f"{type(e).__name__}: {str(e)[:400]}") from None
        raise


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    # (flat first: a 0-dim tensor, a loss, has no byte view of its own)
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)) if a.numel() else True


def _cases(spec: OpSpec, seeds: int) -> list[tuple[str, int]]:
    return [("random", s) for s in range(seeds)] + [(c, 100 + i) for i, c in enumerate(spec.cases) if c != "random"]


def verify_candidate(
    fns: dict[int, Any],
    spec: OpSpec,
    dtype: str,
    shapes: list[tuple[int, int]],
    seeds: int = 2,
    repeats: int = 3,
    base_seed: int = 0,
) -> VerifyResult:
    t0 = time.perf_counter()
    scalars = list(spec.scalars.values())
    runs = 0
    notes: list[str] = []
    kb = verify.KernelBenchTally()
    largest = {n: max(m for m, nn in shapes if nn == n) for _, n in shapes}

    def fail(check: str, m: int, n: int, case: str, seed: int, detail: str) -> VerifyResult:
        f = CheckFailure(check, m, n, case, seed, detail)
        return VerifyResult(False, runs, shapes, f, notes, time.perf_counter() - t0, kb.as_dict())

    for m, n in shapes:
        fn = fns[n]
        for case, seed in _cases(spec, seeds):
            if case != "random" and m != largest[n]:
                continue  # special values once per N, on the large shape
            gen = torch.Generator().manual_seed(base_seed * 7919 + seed * 104729 + m * 31 + n)
            fresh = spec.make_inputs(m, n, dtype, gen, case, "cuda")
            ins = [guarded(tuple(x.shape), x.dtype) for x in fresh]
            for g_, x in zip(ins, fresh):
                g_.view.copy_(x)
            outs = [guarded(t.shape(m, n), t.torch_dtype(dtype)) for t in spec.outputs]
            before = [x.clone() for x in fresh]
            iv, ov = [g_.view for g_ in ins], [g_.view for g_ in outs]
            verify.poison(ov)
            try:
                _call(fn, iv, ov, scalars)
            except CandidateFault:
                raise
            except Exception as e:  # noqa: BLE001 - the candidate's Python error is a verdict
                return fail("error", m, n, case, seed, f"{type(e).__name__}: {str(e)[:300]}")
            runs += 1
            if not all(g_.guards_intact() for g_ in outs):
                return fail("out_of_bounds_write", m, n, case, seed, "wrote outside the output tensors")
            if not all(_same_bits(a.view, b) for a, b in zip(ins, before)):
                return fail("input_modified", m, n, case, seed, "an input tensor changed during the call")
            bad = verify.compare(spec, dtype, before, ov, tally=kb)
            if bad is not None:
                kind = "unwritten" if bad.unwritten else "mismatch"
                return fail(kind, m, n, case, seed, bad.describe())
            if case != "random" or m != largest[n] or seed != 0:
                continue
            # Same inputs again: a race shows as different bits (or a wrong answer).
            first = [o.clone() for o in ov]
            for _ in range(repeats - 1):
                verify.poison(ov)
                _call(fn, iv, ov, scalars)
                runs += 1
                bad = verify.compare(spec, dtype, before, ov)
                if bad is not None:
                    return fail("nondeterministic", m, n, case, seed, "a repeat on the same inputs: " + bad.describe())
                if not all(_same_bits(a, b) for a, b in zip(first, ov)):
                    notes.append(f"M={m} N={n}: repeats differ in low bits (atomics or reduction order)")
            # New values at the same addresses, outputs left holding the old answer.
            new = spec.make_inputs(m, n, dtype, torch.Generator().manual_seed(seed + 999), case, "cuda")
            for g_, x in zip(ins, new):
                g_.view.copy_(x)
            _call(fn, iv, ov, scalars)
            runs += 1
            bad = verify.compare(spec, dtype, new, ov)
            if bad is not None:
                return fail(
                    "stale", m, n, case, seed, "second call on new inputs at the same addresses: " + bad.describe()
                )
    return VerifyResult(True, runs, shapes, None, notes, time.perf_counter() - t0, kb.as_dict())


_BANDWIDTH: dict[str, float] = {}


def device_bandwidth(
    copy_fn: Callable[[torch.Tensor, torch.Tensor], object] | None,
    read_probes: dict[str, Callable[[int], tuple[Callable[[], object], int]]] | None = None,
) -> tuple[float, float]:
    """(copy, read-only) TB/s, measured once per worker process."""
    if not _BANDWIDTH:
        copies = timing.copy_bandwidths({"cute copy": copy_fn} if copy_fn else None)
        _BANDWIDTH["copy"] = max(copies.values())
        _BANDWIDTH["read"] = timing.read_bandwidth(read_probes)
    return _BANDWIDTH["copy"], _BANDWIDTH["read"]


_GEMM: dict[str, float] = {}


def ceiling(
    spec: OpSpec,
    dtype: str,
    copy_fn: Callable[[torch.Tensor, torch.Tensor], object] | None,
    read_probes: dict[str, Callable[[int], tuple[Callable[[], object], int]]] | None = None,
) -> tuple[float, float]:
    """What the op's rate is a % of, in its unit: (copy, read-only) TB/s for a memory-bound op;
    for a compute-bound one the dense GEMM probe's TFLOP/s in its dtype, twice (measured once a
    worker process and dtype)."""
    if not spec.compute_bound:
        return device_bandwidth(copy_fn, read_probes)
    if dtype not in _GEMM:
        _GEMM[dtype] = timing.gemm_tflops(DTYPES[dtype])
    return _GEMM[dtype], _GEMM[dtype]


def profile_candidate(
    fns: dict[int, Any],
    spec: OpSpec,
    dtype: str,
    shapes: list[tuple[int, int]],
    sol: tuple[float, float],
    baselines: list[str],
) -> ProfileResult:
    t0 = time.perf_counter()
    timing.settle()  # (the verify stage's float64 work has just lowered the clocks)
    copy_tbs, read_tbs = sol
    scalars = list(spec.scalars.values())
    out: list[ShapeTiming] = []
    flags: list[str] = []
    kb = verify.KernelBenchTally()
    for m, n in shapes:
        timed = TimedCalls(fns[n], spec, m, n, dtype, scalars, kb)
        rows = bench.bench_one(
            spec, timed, m, n, dtype, copy_tbs, baselines, ceiling_tbs=max(copy_tbs, read_tbs), check=timed.check
        )
        mine = rows[0]
        if mine.tbs is None:
            raise RuntimeError(f"timing failed at M={m} N={n}: {mine.note}")
        st = ShapeTiming(
            m,
            n,
            mine.ms or 0.0,
            mine.tbs,
            mine.pct_sol or 0.0,
            "no graph" not in mine.note,
            {r.impl: r.tbs for r in rows[1:] if r.tbs},
            {r.impl: r.ms for r in rows[1:] if r.ms},
        )
        for word in ("IMPOSSIBLE", "TIMER MISMATCH", "WRONG TIMED OUTPUT"):
            if word in mine.note:
                st.flags.append(mine.note)
                flags.append(f"M={m} N={n}: {mine.note}")
                break
        out.append(st)
        if timed.failure is not None:
            failure = CheckFailure("timed_output", m, n, "random", 0, timed.failure)
            return ProfileResult(
                False, copy_tbs, read_tbs, out, flags, time.perf_counter() - t0, failure, kb.as_dict(), spec.unit
            )
    return ProfileResult(
        not flags, copy_tbs, read_tbs, out, flags, time.perf_counter() - t0, None, kb.as_dict(), spec.unit
    )


class TimedCalls:
    """The candidate as the benchmark calls it: each input set writes into outputs allocated once
    and poisoned before its first call, so what the timed calls wrote can be checked afterwards.
    A kernel that does less work only at the benchmark's sizes is caught here, not just timed."""

    def __init__(
        self,
        fn: Any,
        spec: OpSpec,
        m: int,
        n: int,
        dtype: str,
        scalars: list,
        tally: verify.KernelBenchTally | None = None,
    ) -> None:
        self.fn, self.spec, self.m, self.n, self.dtype, self.scalars = fn, spec, m, n, dtype, scalars
        self.tally = tally
        self.outputs: dict[int, list[torch.Tensor]] = {}
        self.failure: str | None = None

    def __call__(self, *ins: torch.Tensor) -> None:
        outs = self.outputs.get(ins[0].data_ptr())
        if outs is None:
            outs = self.outputs[ins[0].data_ptr()] = self.spec.alloc_outputs(self.m, self.n, self.dtype, "cuda")
            verify.poison(outs)
        self.fn(*ins, *outs, *self.scalars)

    def check(self, sets: list[list[torch.Tensor]]) -> str | None:
        """Compare the first and the last input set's outputs with the float64 reference, in
        chunks of rows; then free the outputs."""
        torch.cuda.synchronize()
        for ins in dict.fromkeys([0, len(sets) - 1]):
            outs = self.outputs.get(sets[ins][0].data_ptr())
            if outs is None:
                self.failure = "the timed calls never ran on one of the input sets"
                break
            bad = verify.compare_rows(self.spec, self.dtype, sets[ins], outs, tally=self.tally)
            if bad is not None:
                self.failure = f"input set {ins}: {bad.describe()}"
                break
        self.outputs.clear()
        return self.failure
