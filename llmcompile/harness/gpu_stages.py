"""Stages 3 and 4, on the GPU inside a worker: verify a compiled candidate, then profile it (the
memory its calls touch: `guards`; the profile's input sets: `input_sets`; the timed calls and
their checks: `timed_calls`).

Both assume the candidate is hostile and has read this file (docs/judge.md lists the attacks and
what stops each):

- every tensor sits between guard bands (inputs' hold NaN, so a read past an edge poisons the
  answer); every band must be untouched after every call, and a broken one names its tensor;
- during verification, and while the candidate is timed, the inputs are mapped read-only
  (`readonly.py`): a write into one faults at once, even one undone before the kernel returns;
  their bits and their fingerprints must be unchanged after the calls too (where read-only memory
  is unavailable, that is what sees a write);
- the judge's own copy of the inputs, which the answer is checked against, is out of a kernel's
  reach during a call: in read-only device memory as the inputs are (or on the host);
- outputs start as NaN with a payload no arithmetic makes, so an unwritten element shows; a
  scratch workspace starts as NaN too (the contract says its contents are undefined);
- a second call on new values at the same addresses, then one with a few elements changed, must
  give the new answers (no caching by pointer or by a sample of the input);
- edges, spikes, small integers, degenerate rows and other scalar values (`ops.GENERIC_CASES`,
  `OpSpec.scalar_cases`) besides random inputs;
- the timed calls write into output sets that rotate against the input sets, so skipping a call
  (or a part of one) leaves another set's answer behind; every set is checked afterwards, and
  the number of replays is random, so a kernel cannot count its way to the last one;
- then one more call, on a set with a few elements moved and the workspace as the timing left
  it, made right behind the timing's own graph as the timed calls were: an answer kept there
  while timed (verification poisons it) shows, even one served only to calls in quick succession.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from llmcompile.bench import grid, timing
from llmcompile.harness import readonly, verify
from llmcompile.harness.guards import (
    CandidateFault,
    Guarded,
    broken_guard,
    device_fault,
    guard_workspace,
    guarded,
    judge_copy,
    poison_workspace,
    same_bits,
    sync,
)
from llmcompile.harness.input_sets import InputSets, cached_sets, forget_sets
from llmcompile.harness.timed_calls import NUDGE_MOVES, TimedCalls
from llmcompile.harness.verdict import CheckFailure, ProfileResult, ShapeTiming, VerifyResult
from llmcompile.specs import DTYPES, GENERIC_CASES, OpSpec, generic_inputs
from llmcompile.specs.targets import target_here


def _call(fn: Callable, ins: list[torch.Tensor], outs: list[torch.Tensor], scalars: list) -> None:
    try:
        fn(*ins, *outs, *scalars)
        sync()
    except Exception as e:
        if device_fault(e):
            raise CandidateFault(f"{type(e).__name__}: {str(e)[:400]}") from None
        raise


@dataclass(frozen=True)
class Case:
    """One kind of input verification draws: `name` as reported, `base` what the spec's input
    maker is asked for, `scalars` other values than the spec's defaults."""

    name: str
    seed: int
    base: str = "random"
    scalars: dict[str, float | int] | None = None

    @property
    def generic(self) -> bool:
        return self.name in GENERIC_CASES


# The case whose inputs an early-releasing kernel writes just before the call (producer.py): a
# candidate launched as a programmatic dependent that never waits reads them stale.
AFTER_PRODUCER = "written by the kernel just before (dependent launch)"


def cases(spec: OpSpec, seeds: int, device: str = "cuda") -> list[Case]:
    out = [Case("random", s) for s in range(seeds)]
    out += [Case(c, 100 + i, c) for i, c in enumerate(spec.cases) if c != "random"]
    out += [Case(c, 200 + i) for i, c in enumerate(GENERIC_CASES)]
    for i, (base, values) in enumerate(spec.scalar_cases):
        label = ", ".join(f"{k}={v}" for k, v in values.items())
        out.append(Case(f"{base} with {label}", 300 + i, base, dict(values)))
    if device != "cpu":
        out.append(Case(AFTER_PRODUCER, 400))
    return out


@dataclass
class _Run:
    """What verification learnt so far (the result's fields, filled as it goes)."""

    runs: int = 0
    notes: list[str] = field(default_factory=list)
    kb: verify.KernelBenchTally = field(default_factory=verify.KernelBenchTally)
    seconds: dict[str, float] = field(default_factory=dict)  # each case's, by "MxN case/seed"


def _fair(spec: OpSpec, dtype: str, inputs: list[torch.Tensor], scalars: dict, exact: str = "") -> str | None:
    """Why a generic case is not a fair test of `spec` (None: it is): torch's own program fails
    the arithmetic's bound on it (an exp that overflows fp32 where float64 does not, say), or
    with `exact` the exact tolerance, so an honest kernel could too."""
    try:
        own = verify.torch_own(spec, inputs, scalars)
    except verify.TorchProgramFailed as e:
        return f"{e}: no torch output to measure its fairness by"
    if own is None:
        return "the problem has no torch program to measure its fairness by"
    bad = verify.compare(spec, dtype, inputs, own, scalars, widen_by_own=False, exact=exact)
    return None if bad is None else f"torch's own output fails the bound there ({bad.describe()[:160]})"


def verify_candidate(
    fns: dict[int, Any],
    spec: OpSpec,
    dtype: str,
    shapes: list[tuple[int, int]],
    seeds: int = 2,
    repeats: int = 3,
    base_seed: int = 0,
    read_only: bool = True,
    progress: Callable[[int, int, str], None] = lambda m, n, case: None,
    device: str = "cuda",
) -> VerifyResult:
    """Call the candidate on every shape and case against the float64 reference. `read_only`:
    inputs in read-only device memory (a write into one faults: the caller tells that fault from
    others by verifying again with `read_only=False`). `progress(m, n, case)` before each case.
    `device`: where the calls run (the CPU for the judge's own tests, with Python stand-ins)."""
    t0 = time.perf_counter()
    st = _Run()
    why_not = readonly.unavailable_reason() if device != "cpu" else "the CPU has none"
    if read_only and why_not:
        st.notes.append(f"inputs were writable: read-only device memory is unavailable here ({why_not})")
    ro = read_only and not why_not
    # (the judge's copy read-only on the device wherever it has such memory, the inputs writable
    # or not: a verify again with writable inputs, after a fault, then moves nothing to the host)
    mapped = not why_not
    largest = {n: max(m for m, nn in shapes if nn == n) for _, n in shapes}

    def result(failure: CheckFailure | None) -> VerifyResult:
        if st.kb.torch_failed:
            st.notes.append(f"{st.kb.torch_failed}: KernelBench's check was not made, nor torch's error measured")
        return VerifyResult(
            failure is None,
            st.runs,
            shapes,
            failure,
            st.notes,
            time.perf_counter() - t0,
            st.kb.as_dict(),
            ro,
            st.seconds,
        )

    for m, n in shapes:
        for case in cases(spec, seeds, device):
            if case.name != "random" and m != largest[n]:
                continue  # special values once per N, on the large shape
            progress(m, n, case.name)
            again = case.name == "random" and case.seed == 0 and m == largest[n]
            t = time.perf_counter()
            failure = _verify_case(
                fns[n], spec, dtype, m, n, case, base_seed, repeats if again else 0, ro, mapped, st, device
            )
            st.seconds[f"{m}x{n} {case.name}/{case.seed}"] = round(time.perf_counter() - t, 3)
            if failure is not None:
                return result(failure)
    return result(None)


def _verify_case(
    fn: Any,
    spec: OpSpec,
    dtype: str,
    m: int,
    n: int,
    case: Case,
    base_seed: int,
    repeats: int,
    ro: bool,
    mapped: bool,
    st: _Run,
    device: str,
) -> CheckFailure | None:
    """One case at one shape: the call and its checks; with `repeats` (the large shape's first
    random seed) the repeats, the stale-output call and the changed-element call. `ro`: the
    inputs read-only; `mapped`: the judge's copy in read-only device memory (else on the host)."""
    gen = torch.Generator(device=device).manual_seed(base_seed * 7919 + case.seed * 104729 + m * 31 + n)
    made = spec.make_inputs(m, n, dtype, gen, case.base, device)  # (on the GPU: seconds less a verify)
    values = {**spec.scalars, **(case.scalars or {})}
    exact = ""
    if case.generic:
        generic = _generic(spec, dtype, case, made, gen, values, st)
        if generic is None:
            return None
        made, exact = generic
    copy = judge_copy(made, on_device=mapped)
    del made

    def fail(check: str, detail: str) -> CheckFailure:
        return CheckFailure(check, m, n, case.name, case.seed, detail)

    produced = case.name == AFTER_PRODUCER  # (the producer writes the inputs: they stay writable)
    scalars = list(values.values())
    ins: list[Guarded] = []
    try:  # (from the first mapping on: a judge worker lives on after a failed allocation)
        for d, x in zip(spec.inputs, copy.tensors):
            ins.append(guarded(d.name, tuple(x.shape), x.dtype, device, read_only=ro and not produced))
        outs = [guarded(t.name, t.shape(m, n), t.torch_dtype(dtype), device) for t in spec.outputs]
        ws = guard_workspace(fn, ins[0].view.device if ins else torch.device(device))

        def load_inputs() -> None:  # the guarded inputs from the judge's copy, as it now stands
            for g_, x in zip(ins, copy.tensors):
                g_.load(x)

        if not produced:
            load_inputs()
        iv, ov = [g_.view for g_ in ins], [g_.view for g_ in outs]

        def call_and_check(
            expected: list[torch.Tensor], what: str, poison: bool = True, ref: verify.Reference | None = None
        ) -> CheckFailure | None:
            """`ref`: the float64 reference of `expected`, where one is made already."""
            if poison:
                verify.poison(ov)
            poison_workspace(fn)
            if produced:  # last before the call: nothing may stand between the producer and it
                _produce_inputs(ins, copy.tensors)
            try:
                _call(fn, iv, ov, scalars)
            except CandidateFault:
                raise
            except Exception as e:  # noqa: BLE001 - the candidate's Python error is a verdict
                return fail("error", f"{type(e).__name__}: {str(e)[:300]}")
            st.runs += 1
            if (name := broken_guard(outs + ws + ins)) is not None:
                kind = ({g_.name: "input" for g_ in ins} | {g_.name: "output" for g_ in outs} | {"workspace": "scratch"})[name]  # fmt: skip
                return fail("out_of_bounds_write", f"{what}wrote outside the {kind} `{name}` (its guard band changed)")
            refs = [x.to(device) for x in expected]
            if changed := [g_.name for g_, r in zip(ins, refs) if not same_bits(g_.view, r)]:
                return fail("input_modified", f"{what}the input `{changed[0]}` changed during the call")
            if ref is not None:
                bad = ref.check(ov, exact)
            else:
                bad = verify.compare(
                    spec, dtype, refs, ov, dict(values), tally=st.kb if not what else None, exact=exact
                )
            if bad is not None:
                return fail("unwritten" if bad.unwritten else "mismatch", what + bad.describe())
            return None

        if failure := call_and_check(copy.tensors, ""):
            return failure
        if not repeats:
            return None
        # Same inputs again: a race shows as different bits (or a wrong answer).
        first = [o.clone() for o in ov]
        for _ in range(repeats - 1):
            if failure := call_and_check(copy.tensors, "a repeat on the same inputs: "):
                return CheckFailure("nondeterministic", m, n, case.name, case.seed, failure.detail)
            if not all(same_bits(a, b) for a, b in zip(first, ov)):
                st.notes.append(f"M={m} N={n}: repeats differ in low bits (atomics or reduction order)")
        # New values at the same addresses, outputs left holding the old answer.
        regen = torch.Generator(device=device).manual_seed(case.seed + 999)
        copy.load(spec.make_inputs(m, n, dtype, regen, case.base, device))
        load_inputs()
        if failure := call_and_check(copy.tensors, "second call on new inputs at the same addresses: ", poison=False):
            return CheckFailure("stale", m, n, case.name, case.seed, failure.detail)
        # (moved by a move the check sees: the answer the outputs now hold must fail on the moved
        # inputs; +1 hides within bf16's bound on a softmax row of 1024)
        for move in NUDGE_MOVES:
            back = copy.nudge(case.seed + 4242, move)
            ref = verify.Reference(spec, dtype, [x.to(device) for x in copy.tensors], dict(values))
            if ref.check(ov, exact) is not None:
                break
            back()
        else:
            copy.nudge(case.seed + 4242)
            ref = None
        load_inputs()
        if failure := call_and_check(
            copy.tensors, "third call with a few input elements changed in place: ", poison=False, ref=ref
        ):
            return CheckFailure("stale", m, n, case.name, case.seed, failure.detail)
        return None
    finally:
        for g_ in ins:
            g_.release()
        copy.release()


def _generic(
    spec: OpSpec,
    dtype: str,
    case: Case,
    inputs: list[torch.Tensor],
    gen: torch.Generator,
    values: dict,
    st: _Run,
) -> tuple[list[torch.Tensor], str] | None:
    """A generic case's inputs (made from random `inputs`) and the exactness their outputs are
    held to (`verify.exact_tolerance`; "" for none); None (with a note) where the case says
    nothing here or is not fair."""
    dev = generic_inputs(case.name, inputs, gen)
    if dev is None:
        return None
    if (why := _fair(spec, dtype, dev, values)) is not None:
        st.notes.append(f"case {case.name} skipped at M={dev[0].shape[0]}: {why}")
        return None
    exact = spec.exact if case.name == "integers" else ""
    if exact and (why := _fair(spec, dtype, dev, values, exact=exact)) is not None:
        st.notes.append(f"case integers compared by the order bound, not exactly: {why}")
        exact = ""
    return dev, exact


def _produce_inputs(ins: list[Guarded], copy: list[torch.Tensor]) -> None:
    """The inputs as stale values (NaN; 0 for indices) that the producer kernel overwrites with
    the real ones, releasing its dependents first; the caller launches the candidate right after,
    on the same stream, with no synchronisation between."""
    from llmcompile.harness import producer

    staged = [x.to(g_.view.device) for g_, x in zip(ins, copy)]
    for g_ in ins:
        g_.view.fill_(float("nan") if g_.view.is_floating_point() else 0)
    sync()
    for g_, x in zip(ins, staged):
        producer.produce(x, g_.view)


_BANDWIDTH: dict[str, float] = {}


# A copy below this share of the card's datasheet bandwidth was measured beside other work, or in
# a slow spell: measured again, up to LOW_COPY_TRIES times, the best kept. Alone, a copy reads
# 0.90 of an H100's 3.35 TB/s and 0.83-0.88 of an H200's 4.8. A worker whose copy was measured
# beside another process put an honest kernel at 137% of it (a copy of about 1.85 TB/s, 0.39).
LOW_COPY_SHARE = 0.7
LOW_COPY_TRIES = 3


def device_bandwidth(
    copy_fn: Callable[[torch.Tensor, torch.Tensor], object] | None,
    read_probes: dict[str, Callable[[int], tuple[Callable[[], object], int]]] | None = None,
    fresh: bool = False,
) -> tuple[float, float]:
    """(copy, read-only) TB/s, measured once per worker process (again where `fresh`); a copy far
    below the card's datasheet measured again (`LOW_COPY_SHARE`)."""
    if not _BANDWIDTH or fresh:
        here = target_here()
        best = 0.0
        for _ in range(LOW_COPY_TRIES):
            best = max(best, *timing.copy_bandwidths({"cute copy": copy_fn} if copy_fn else None).values())
            if here is None or best >= LOW_COPY_SHARE * here.nominal_bandwidth_tbs:
                break
        _BANDWIDTH["copy"] = best
        _BANDWIDTH["read"] = timing.read_bandwidth(read_probes)
    return _BANDWIDTH["copy"], _BANDWIDTH["read"]


_GEMM: dict[str, float] = {}


def forget_ceilings() -> None:
    """Drop the ceilings this process measured: the GPU was found shared, and they may have been
    measured beside the other work, low (an honest kernel then read 137% of copy on an H200)."""
    _BANDWIDTH.clear()
    _GEMM.clear()


def ceiling(
    spec: OpSpec,
    dtype: str,
    copy_fn: Callable[[torch.Tensor, torch.Tensor], object] | None,
    read_probes: dict[str, Callable[[int], tuple[Callable[[], object], int]]] | None = None,
    fresh: bool = False,
) -> tuple[float, float]:
    """What the op's rate is a % of, in its unit: (copy, read-only) TB/s for a memory-bound op;
    for a compute-bound one the dense GEMM probe's TFLOP/s in its dtype, twice (measured once a
    worker process and dtype, and again where `fresh`)."""
    if not spec.compute_bound:
        return device_bandwidth(copy_fn, read_probes, fresh)
    if dtype not in _GEMM or fresh:
        _GEMM[dtype] = timing.gemm_tflops(DTYPES[dtype])
    return _GEMM[dtype], _GEMM[dtype]


# Flags of the timing alone: a kernel escaping the timed stream, or a rate no honest kernel
# reaches; and the same two marks another process on the GPU leaves on an honest one.
TIMING_FLAGS = ("IMPOSSIBLE", "TIMER MISMATCH")


class GpuShared(RuntimeError):
    """The GPU did not time the judge's own copy honestly: something else is using it (or the host
    is too busy to feed it), and no timing taken now says anything of the candidate."""


def timed_fairly(
    time_shape: Callable[[], list[grid.BenchRow]],
    calm: Callable[[], str | None],
    remeasure: Callable[[], None],
) -> list[grid.BenchRow]:
    """One shape's rows (ours first). A flag of the timing alone is the candidate's only where it
    stays on a second timing and the GPU times the judge's own copy honestly (`calm`: None) before
    and after it; a rate above the ceiling is timed again against a ceiling measured again (one
    measured while something else ran is low). Where the GPU does not calm: GpuShared."""
    rows = time_shape()
    note = rows[0].note
    if "WRONG TIMED OUTPUT" in note or not any(w in note for w in TIMING_FLAGS):
        return rows
    if (why := calm()) is not None:
        forget_ceilings()
        raise GpuShared(why)
    if "IMPOSSIBLE" in note:
        remeasure()
    rows = time_shape()
    if any(w in rows[0].note for w in TIMING_FLAGS) and (why := calm()) is not None:
        forget_ceilings()
        raise GpuShared(why)
    return rows


@contextmanager
def _candidates_turn(sets: InputSets, read_only: bool, progress: Callable[[str], None]) -> Iterator[None]:
    """The candidate's timing (and its nudged call, `TimedCalls._nudged_call`): its inputs read-only
    where `read_only` (the baselines' never: a fault there is the judge's), and its start and end
    told (`progress`), so that a fault is attributed to the candidate's read-only run only where it
    happened there. Leaving the block synchronizes: a fault of the candidate's work cannot surface
    after it."""
    progress("timed")
    try:
        with sets.read_only() if read_only else nullcontext():
            yield
    except BaseException as e:
        if not device_fault(e):  # (the candidate's Python error: reported, and the timing goes on)
            progress("after timed")
        raise
    progress("after timed")


def _time_shape(
    spec: OpSpec,
    timed: TimedCalls,
    dtype: str,
    ceil: dict[str, float],
    baselines: list[str],
    turn: Callable[[], AbstractContextManager[None]],
    views: list[list[torch.Tensor]],
    spent: dict[str, float] | None = None,
) -> list[grid.BenchRow]:
    """One timing of a shape, against the ceiling as last measured; the candidate's inside
    `turn` (`_candidates_turn`); its seconds added to `spent` (`grid.bench_one`'s)."""
    m, n, copy_tbs = timed.m, timed.n, ceil["copy"]
    return grid.bench_one(
        spec,
        timed,
        m,
        n,
        dtype,
        copy_tbs,
        baselines,
        ceiling_tbs=max(ceil.values()),
        check=timed.check,
        sets=views,
        inside={"llmcompile": turn},
        spent=spent,
    )


def profile_candidate(
    fns: dict[int, Any],
    spec: OpSpec,
    dtype: str,
    shapes: list[tuple[int, int]],
    sol: tuple[float, float],
    baselines: list[str],
    need_bytes: dict[tuple[int, int], tuple[int, int]] | None = None,
    cached: dict[tuple[int, int], dict[str, dict[str, float]]] | None = None,
    remeasure: Callable[[], tuple[float, float]] | None = None,
    read_only: bool = True,
    progress: Callable[[int, int, str], None] = lambda m, n, what: None,
) -> ProfileResult:
    """Time the candidate at each shape beside the baselines not in `cached` ((m, n) -> baseline
    -> {ms, tbs, age_s}: timed earlier on this machine, reported with their age), and check what
    the timed calls did (TimedCalls). `remeasure`: `sol` measured again, for a rate above it
    (`timed_fairly`). `read_only`: the inputs read-only while the candidate is timed (a write
    into one faults: the caller tells that fault from others by profiling again without).
    `progress(m, n, what)` as each shape's phases begin: "sets", "timed" (the candidate's timing,
    where a fault is its own), "after timed" (the baselines and the checks)."""
    t0 = time.perf_counter()
    ceil = dict(zip(("copy", "read"), sol))
    spent: dict[str, float] = {}  # where the profile's time goes (`ProfileResult.phases_s`)
    with timing.spending(spent, "settle"):
        timing.settle(ceil["copy"])  # (after the verify stage's float64 work, the clocks may be low)

    def measure_again() -> None:
        if remeasure is not None:
            ceil["copy"], ceil["read"] = remeasure()

    def calm() -> str | None:
        # (CALM_S over the whole profile, its waits so far in spent["calm"]: the stage's deadline
        # is never the GPU's doing)
        with timing.spending(spent, "calm"):
            return timing.wait_calm(_BANDWIDTH.get("copy"), max(0.0, timing.CALM_S - spent.get("calm", 0.0)))

    scalars = list(spec.scalars.values())
    out: list[ShapeTiming] = []
    flags: list[str] = []
    checks: list[str] = []
    kb = verify.KernelBenchTally()
    guarded_all = True  # every shape's inputs were read-only while the candidate ran
    for m, n in shapes:
        progress(m, n, "sets")
        with timing.spending(spent, "sets"):
            sets = cached_sets(spec, m, n, dtype, (need_bytes or {}).get((m, n), (0, 0)))
        guarded_all = guarded_all and read_only and sets.mapping is not None
        timed = TimedCalls(fns[n], spec, m, n, dtype, scalars, sets, kb)
        timed.turn = functools.partial(_candidates_turn, sets, read_only, functools.partial(progress, m, n))
        # (room for the float64 check: the other shapes' sets go before it falls back to torch's output)
        timed.make_room = lambda key=(spec.ref, m, n, dtype): forget_sets(keep=lambda k: k == key)
        known = (cached or {}).get((m, n), {})
        rows = timed_fairly(
            functools.partial(
                _time_shape,
                spec,
                timed,
                dtype,
                ceil,
                [b for b in baselines if b not in known],
                timed.turn,
                sets.views,
                spent,
            ),
            calm,
            measure_again,
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
            {**{b: e["tbs"] for b, e in known.items()}, **{r.impl: r.tbs for r in rows[1:] if r.tbs}},
            {**{b: e["ms"] for b, e in known.items()}, **{r.impl: r.ms for r in rows[1:] if r.ms}},
            baseline_age_s={b: e["age_s"] for b, e in known.items()},
            baseline_notes={r.impl: r.note for r in rows[1:] if r.tbs and any(w in r.note for w in TIMING_FLAGS)},
        )
        for word in (*TIMING_FLAGS, "WRONG TIMED OUTPUT"):
            if word in mine.note:
                st.flags.append(mine.note)
                flags.append(f"M={m} N={n}: {mine.note}")
                break
        out.append(st)
        one = " on one input set (two did not fit: outputs could not rotate)" if timed.k == 1 else ""
        checks.append(f"M={m} N={n}: {timed.method}{one}{timed.nudge_note}")
        timed.release()
        if timed.failure is not None:
            failure = CheckFailure(timed.check_kind, m, n, "random", 0, timed.failure)
            return ProfileResult(
                False,
                ceil["copy"],
                ceil["read"],
                out,
                flags,
                time.perf_counter() - t0,
                failure,
                kb.as_dict(),
                spec.unit,
                checks,
                read_only=guarded_all,
                phases_s=_phases(spent, time.perf_counter() - t0),
            )
    for st in out:  # (against the ceiling as last measured: the same for every shape)
        st.pct_sol = 100 * st.tbs / ceil["copy"]
    # (one look, where baselines were timed here: a baseline timed beside another process would be
    # cached for a week; a false alarm costs only their timing again next time)
    fresh = any(st.baselines.keys() - st.baseline_age_s.keys() for st in out)
    with timing.spending(spent, "calm"):
        disturbed = (timing.disturbance(_BANDWIDTH.get("copy")) or "") if fresh else ""  # (as calm(): TB/s)
    if disturbed:
        forget_ceilings()
    seconds = time.perf_counter() - t0
    return ProfileResult(
        not flags,
        ceil["copy"],
        ceil["read"],
        out,
        flags,
        seconds,
        None,
        kb.as_dict(),
        spec.unit,
        checks,
        disturbed,
        guarded_all,
        _phases(spent, seconds),
    )


def _phases(spent: dict[str, float], seconds: float) -> dict[str, float]:
    """`spent` as a profile reports it: the candidate's timing by that name, the rest of the
    stage's `seconds` (the sets' release, the loop) as "other"."""
    out = {"candidate" if k == "llmcompile" else k: round(v, 3) for k, v in spent.items()}
    out["other"] = round(max(0.0, seconds - sum(spent.values())), 3)
    return out
