"""Stages 3 and 4, on the GPU inside a worker: verify a compiled candidate, then profile it.

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
import random
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from llmcompile.bench import grid, timing
from llmcompile.harness import readonly, verify
from llmcompile.harness.verdict import CheckFailure, ProfileResult, ShapeTiming, VerifyResult
from llmcompile.specs import DTYPES, GENERIC_CASES, OpSpec, generic_inputs
from llmcompile.specs.targets import target_here

GUARD_BYTES = 4096
INT_GUARD = 1 << 40  # an index no row has: reading it as a target gives nonsense, not a pass
MIN_TIMED_SETS = 2  # input sets the timed calls rotate over at least: outputs rotate against them
NUDGED_ROWS = 8  # rows of the nudged call's input given one moved element each (fewer where it has fewer)
# The moves tried, in turn, until the answer already held (the timed calls', or verification's
# second call's) fails the check on the moved inputs (the check must see a stale answer): +1 is
# within bf16's tolerance of a softmax row of 1024, +16 is not; a min sees only a move down. The
# nudged call on a shape checked whole (rows not independent) tries only the largest, each try a
# float64 reference of the whole set.
NUDGE_MOVES = (1.0, 16.0, 256.0, -1.0, -16.0, -256.0)
NUDGE_MOVES_WHOLE = (256.0, -256.0)


class CandidateFault(Exception):
    """The candidate broke the CUDA context (illegal address, trap): the worker must go."""


@contextmanager
def _access(mappings: list[readonly.Mapping], writable: bool) -> Iterator[None]:
    """`mappings` writable (or read-only) for the block, back after it (access changes are not
    stream-ordered: synchronised around). A block that raises a device fault leaves them to
    `release`: after a fault, the context may take no further calls."""

    def flip(to: bool) -> None:
        if mappings:
            _sync()
        for m in mappings:
            m.set_writable(to)

    flip(writable)
    try:
        yield
    except BaseException as e:
        if not device_fault(e):
            flip(not writable)
        raise
    flip(not writable)


def _writable(mappings: list[readonly.Mapping]) -> AbstractContextManager[None]:
    """Read-only `mappings` made writable for the block (the judge's own loads)."""
    return _access(mappings, True)


def _freed(mapping: readonly.Mapping | None) -> None:
    """Free `mapping` once the GPU is done with it (None: nothing to free); None, to assign."""
    if mapping is not None:
        _sync()
        mapping.free()


@dataclass
class Guarded:
    """A tensor between two guard bands; in read-only device memory when `mapping` is set."""

    name: str
    view: torch.Tensor
    buf: torch.Tensor
    g: int  # guard elements on each side
    guard: torch.Tensor  # the bytes of one band as allocated
    mapping: readonly.Mapping | None = None

    def guards_intact(self) -> bool:
        b = self.buf.view(torch.uint8)
        gb = self.g * self.buf.element_size()
        return torch.equal(b[:gb], self.guard) and torch.equal(b[-gb:], self.guard)

    def load(self, x: torch.Tensor) -> None:
        """Copy `x` in; a read-only one is made writable for the copy and read-only again."""
        with _writable([self.mapping] if self.mapping is not None else []):
            self.view.copy_(x)

    def release(self) -> None:
        self.mapping = _freed(self.mapping)


@dataclass
class JudgeCopy:
    """The judge's own copy of a case's inputs, which the guarded inputs are loaded from and the
    answer is checked against: a candidate must not change it during its call. Read-only device
    memory where the device has it (no call moves it: on the host, KernelBench 45's 3.2 GB input
    took 2.3 s to copy there, 0.4 s back per check, 5.4 s to nudge; H200); else pageable host
    memory, which these GPUs' kernels cannot address (no pageable memory access)."""

    tensors: list[torch.Tensor]
    mappings: list[readonly.Mapping] = field(default_factory=list)

    def load(self, xs: list[torch.Tensor]) -> None:
        with _writable(self.mappings):
            for t, x in zip(self.tensors, xs):
                t.copy_(x)

    def nudge(self, seed: int, move: float = 1.0) -> Callable[[], None]:
        """One element in every 1024 of the first floating input (and at least one) moved by
        `move`, in place: an answer cached by a sample of the input shows. Returns what puts them
        back."""
        x = next((t for t in self.tensors if t.is_floating_point() and t.numel()), None)
        if x is None:
            return lambda: None
        flat = x.view(-1)
        gen = torch.Generator(device=x.device).manual_seed(seed)
        where = torch.randint(0, flat.numel(), (max(1, flat.numel() // 1024),), generator=gen, device=x.device)
        old = flat[where].clone()
        with _writable(self.mappings):
            flat[where] = (old.double() + move).to(x.dtype)

        def back() -> None:
            with _writable(self.mappings):
                flat[where] = old

        return back

    def release(self) -> None:
        if self.mappings:
            _sync()
        for m in self.mappings:
            m.free()
        self.mappings = []


def judge_copy(xs: list[torch.Tensor], on_device: bool) -> JudgeCopy:
    """A JudgeCopy of `xs`: on the device (read-only) or on the host."""
    if not on_device:
        return JudgeCopy([x.to("cpu", copy=True) for x in xs])
    copy = JudgeCopy([])
    try:
        for x in xs:
            nbytes = x.numel() * x.element_size()
            copy.mappings.append(readonly.allocate(max(1, nbytes), x.device.index))
            copy.tensors.append(copy.mappings[-1].tensor(nbytes).view(x.dtype).view(x.shape))
        copy.load(xs)
    except BaseException:
        copy.release()
        raise
    return copy


def slab_bytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    """Bytes a guarded tensor takes, its bands included, rounded up to the 512 bytes torch aligns
    allocations to (so slabs laid end to end keep every view aligned as its own allocation would)."""
    esize = torch.empty((), dtype=dtype).element_size()
    raw = (torch.Size(shape).numel() + 2 * (GUARD_BYTES // esize)) * esize
    return -(-raw // 512) * 512


def guarded(
    name: str,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: str = "cuda",
    read_only: bool = False,
    within: torch.Tensor | None = None,
) -> Guarded:
    """`within`: uint8 memory of `slab_bytes` to lay the tensor in (its owner frees it), in place
    of an allocation of its own (a read-only mapping of its own where `read_only`)."""
    numel = torch.Size(shape).numel()
    esize = torch.empty((), dtype=dtype).element_size()
    g = GUARD_BYTES // esize  # keeps the view 16-byte aligned: allocations are 512-aligned
    mapping = None
    try:
        if within is not None:
            buf = within[: (numel + 2 * g) * esize].view(dtype)
        elif read_only:
            mapping = readonly.allocate((numel + 2 * g) * esize)
            buf = mapping.tensor((numel + 2 * g) * esize).view(dtype)
        else:
            buf = torch.empty(numel + 2 * g, dtype=dtype, device=device)
        buf.fill_(float("nan") if dtype.is_floating_point else INT_GUARD)
        guard = buf.view(torch.uint8)[: g * esize].clone()
    except BaseException:
        if mapping is not None:
            mapping.free()
        raise
    return Guarded(name, buf[g : g + numel].view(shape), buf, g, guard, mapping)


def device_fault(e: BaseException) -> bool:
    """Whether an exception is a fault a kernel can raise on the device (an illegal address, a
    trap: whatever the CUDA runtime reports). Running out of memory is not one: a kernel
    allocates nothing, so that is the judge's memory plan falling short."""
    text = f"{type(e).__name__} {e}"
    if "OutOfMemory" in text or "out of memory" in text:
        return False
    return isinstance(e, CandidateFault) or any(w in text for w in ("CUDA", "cuda", "illegal"))


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _call(fn: Callable, ins: list[torch.Tensor], outs: list[torch.Tensor], scalars: list) -> None:
    try:
        fn(*ins, *outs, *scalars)
        _sync()
    except Exception as e:
        if device_fault(e):
            raise CandidateFault(f"{type(e).__name__}: {str(e)[:400]}") from None
        raise


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    # (flat first: a 0-dim tensor, a loss, has no byte view of its own)
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)) if a.numel() else True


def poison_workspace(fn: Any) -> None:
    """NaN into a kernel's scratch workspace (contract rule 6: undefined on entry), so a kernel
    that keeps state there between calls shows."""
    verify.poison(list(getattr(fn, "buffers", {}).values()))


def guard_workspace(fn: Any, device: torch.device) -> list[Guarded]:
    """The kernel's scratch workspace on `device` laid between guard bands (the runtime's own
    allocation has none: a write past it would land unseen in whatever torch put next to it);
    [] for a kernel without one. Its bands are checked as an output's are."""
    elems = getattr(fn, "elems", 0)
    if not elems or not isinstance(getattr(fn, "buffers", None), dict):
        return []
    ws = guarded("workspace", (elems,), torch.float32, str(device))
    fn.buffers[device] = ws.view
    return [ws]


def broken_guard(tensors: list[Guarded]) -> str | None:
    """The name of the first tensor whose guard bands changed."""
    return next((t.name for t in tensors if not t.guards_intact()), None)


# The weighted fingerprint's period: a prime, so a rotation or swap of elements changes it.
_FP_PERIOD = 65521
_FP_CHUNK = 1 << 24


def fingerprint(t: torch.Tensor) -> tuple[int, int]:
    """Two checksums of a tensor's bits (their sum, and their sum weighted by position), computed
    on the device, in chunks: an input changed during the timed calls changes them. Host ints,
    out of any kernel's reach."""
    flat = t.reshape(-1)
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[flat.element_size()]
    bits = flat.view(ints)
    total = torch.zeros((), dtype=torch.int64, device=t.device)
    weighted = torch.zeros((), dtype=torch.int64, device=t.device)
    w = torch.arange(min(_FP_CHUNK, bits.numel()), device=t.device, dtype=torch.int64) % _FP_PERIOD + 1
    for lo in range(0, bits.numel(), _FP_CHUNK):
        c = bits[lo : lo + _FP_CHUNK].to(torch.int64)
        total += c.sum()
        weighted += (c * w[: c.numel()]).sum()
    return int(total), int(weighted)


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
            if changed := [g_.name for g_, r in zip(ins, refs) if not _same_bits(g_.view, r)]:
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
            if not all(_same_bits(a, b) for a, b in zip(first, ov)):
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
    _sync()
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


@dataclass
class InputSets:
    """The timed calls' input sets, each tensor between NaN guard bands, fingerprinted when made
    (kept by the worker across candidates while memory allows: `cached_sets`). All of them in one
    mapping (`mapping`; None where read-only device memory is unavailable, or on the CPU), which
    `read_only` makes read-only while the candidate is timed: a write into an input faults there,
    even one put back before the kernel returns, which fingerprints cannot see. One mapping for
    all the sets, not one a tensor: a tiny shape has up to 64 sets of a few tensors each (enough
    to keep L2 cold), and each mapping is a 2 MB granule at least."""

    guarded: list[list[Guarded]]
    prints: list[list[tuple[int, int]]]
    mapping: readonly.Mapping | None = None

    @property
    def views(self) -> list[list[torch.Tensor]]:
        return [[g_.view for g_ in s] for s in self.guarded]

    def nbytes(self) -> int:
        return sum(g_.buf.numel() * g_.buf.element_size() for s in self.guarded for g_ in s)

    def tampered(self) -> str | None:
        """Which input changed since the sets were made (its guard bands or its bits), if any."""
        for k, (s, prints) in enumerate(zip(self.guarded, self.prints)):
            for g_, p in zip(s, prints):
                if not g_.guards_intact():
                    return f"the guard band of input `{g_.name}` (set {k}) changed: a write past its edge"
                if fingerprint(g_.view) != p:
                    return f"input `{g_.name}` (set {k}) changed during the timed calls"
        return None

    def read_only(self) -> AbstractContextManager[None]:
        """The sets read-only for the block (the candidate's timing), writable after it for the
        judge's own code (baselines, checks). A block that raises a device fault leaves them:
        the context takes no further calls, and the worker ends."""
        return _access([self.mapping] if self.mapping is not None else [], False)

    @contextmanager
    def writable_alias(self) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        """For the block, each input tensor as the judge may write it in stream order while the
        candidate sees it read-only: the same bytes at a second, writable address
        (`readonly.Alias`); the tensor itself where there is no mapping. Unmapped after the block
        (which synchronizes first, `_candidates_turn`)."""
        if self.mapping is None:
            yield lambda t: t
            return
        alias = self.mapping.alias()
        try:
            yield alias.view_of
        except BaseException as e:
            if not device_fault(e):  # (after a fault the context takes no more calls: the worker ends)
                _sync()
                alias.free()
            raise
        _sync()
        alias.free()

    def release(self) -> None:
        """Free the mapping (the views into it must not be used after)."""
        self.mapping = _freed(self.mapping)


def make_sets(
    spec: OpSpec, m: int, n: int, dtype: str, seed: int = 0, count: int | None = None, device: str = "cuda"
) -> InputSets:
    """Enough random input sets to keep L2 cold (and at least MIN_TIMED_SETS), made on the GPU,
    in one read-only-capable mapping where the device has them."""
    if count is None:
        count = max(MIN_TIMED_SETS, timing.rotation_count(spec.bytes_moved(m, n, dtype)))
    gen = torch.Generator(device=device).manual_seed(seed)
    made = spec.make_inputs(m, n, dtype, gen, "random", device)
    slabs = [slab_bytes(tuple(x.shape), x.dtype) for x in made]
    sets = InputSets([], [])
    if device != "cpu" and not readonly.unavailable_reason():
        sets.mapping = readonly.allocate(count * sum(slabs), torch.device(device).index)
    whole = sets.mapping.tensor(sets.mapping.size) if sets.mapping is not None else None
    try:
        at = 0
        for k in range(count):
            if k:
                made = spec.make_inputs(m, n, dtype, gen, "random", device)
            guard = []
            for d, x, size in zip(spec.inputs, made, slabs):
                within = whole[at : at + size] if whole is not None else None
                at += size
                g_ = guarded(d.name, tuple(x.shape), x.dtype, device, within=within)
                g_.view.copy_(x)
                guard.append(g_)
            del made
            sets.guarded.append(guard)
            sets.prints.append([fingerprint(g_.view) for g_ in guard])
    except BaseException:
        sets.release()
        raise
    return sets


_SETS: dict[tuple, InputSets] = {}


def cached_sets(spec: OpSpec, m: int, n: int, dtype: str, need: tuple[int, int] = (0, 0)) -> InputSets:
    """The input sets for (spec, shape, dtype), made once per worker process and reused by later
    candidates of the same problem while they stay untouched (another problem's are dropped).
    `need`: what the stage needs with its usual sets and with one; older shapes' sets are dropped
    while the GPU's free memory falls short of the first, and where it still does, the shape is
    timed on one set."""
    key = (spec.ref, m, n, dtype)
    forget_sets(keep=lambda k: k[0] == spec.ref and k[3] == dtype)
    if key in _SETS and _SETS[key].tampered() is None:
        _SETS[key] = _SETS.pop(key)  # most recently used last
        return _SETS[key]
    if key in _SETS:
        _SETS.pop(key).release()
    while _SETS and _free() < need[0]:
        _SETS.pop(next(iter(_SETS))).release()
    one = _free() < need[0]
    _SETS[key] = made = make_sets(spec, m, n, dtype, count=1 if one else None)
    return made


def _free() -> int:
    """What the GPU could give now: the driver's free memory and torch's cached, unused blocks."""
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info()[0]


def forget_sets(keep: Callable[[tuple], bool] = lambda k: False) -> None:
    """Drop the cached input sets whose key `keep` does not want."""
    for k in [k for k in _SETS if not keep(k)]:
        _SETS.pop(k).release()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


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
) -> list[grid.BenchRow]:
    """One timing of a shape, against the ceiling as last measured; the candidate's inside
    `turn` (`_candidates_turn`)."""
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
    timing.settle(ceil["copy"])  # (after the verify stage's float64 work, the clocks may be low)

    def measure_again() -> None:
        if remeasure is not None:
            ceil["copy"], ceil["read"] = remeasure()

    waited = [0.0]  # (CALM_S over the whole profile: its stage deadline is never the GPU's doing)

    def calm() -> str | None:
        t = time.perf_counter()
        why = timing.wait_calm(_BANDWIDTH.get("copy"), max(0.0, timing.CALM_S - waited[0]))
        waited[0] += time.perf_counter() - t
        return why

    scalars = list(spec.scalars.values())
    out: list[ShapeTiming] = []
    flags: list[str] = []
    checks: list[str] = []
    kb = verify.KernelBenchTally()
    guarded_all = True  # every shape's inputs were read-only while the candidate ran
    for m, n in shapes:
        progress(m, n, "sets")
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
            )
    for st in out:  # (against the ceiling as last measured: the same for every shape)
        st.pct_sol = 100 * st.tbs / ceil["copy"]
    # (one look, where baselines were timed here: a baseline timed beside another process would be
    # cached for a week; a false alarm costs only their timing again next time)
    fresh = any(st.baselines.keys() - st.baseline_age_s.keys() for st in out)
    disturbed = (timing.disturbance(_BANDWIDTH.get("copy")) or "") if fresh else ""  # (as calm(): TB/s)
    if disturbed:
        forget_ceilings()
    return ProfileResult(
        not flags,
        ceil["copy"],
        ceil["read"],
        out,
        flags,
        time.perf_counter() - t0,
        None,
        kb.as_dict(),
        spec.unit,
        checks,
        disturbed,
        guarded_all,
    )


@dataclass
class Nudge:
    """One element in each of a few random rows (the first dimension) of an input set's first
    floating input (`index`), moved by `move` in place only within `moved()`: a cache keyed by a
    sample of the whole input, or of each row, misses them."""

    index: int
    flat: torch.Tensor
    where: torch.Tensor
    old: torch.Tensor
    rows: torch.Tensor  # the rows they lie in
    move: float = 1.0

    @classmethod
    def of(cls, inputs: list[torch.Tensor], rng: random.Random) -> Nudge | None:
        """None: no floating input to move."""
        k, x = next(((k, t) for k, t in enumerate(inputs) if t.is_floating_point() and t.numel()), (0, None))
        if x is None:
            return None
        rows = x.shape[0] if x.dim() else 1
        per = x.numel() // rows
        picked = sorted(rng.sample(range(rows), min(NUDGED_ROWS, rows)))
        where = torch.tensor([r * per + rng.randrange(per) for r in picked], device=x.device)
        flat = x.view(-1)
        return cls(k, flat, where, flat[where].clone(), torch.tensor(picked, device=x.device))

    def write(self, into: torch.Tensor | None = None) -> None:
        """The moved values into `flat` (or `into`, the same bytes at another address), in stream
        order: capturable in a CUDA graph."""
        new = (self.old.double() + self.move).to(self.flat.dtype)
        (self.flat if into is None else into).index_copy_(0, self.where, new)

    def put_back(self) -> None:
        self.flat[self.where] = self.old

    @contextmanager
    def moved(self, written: bool = False) -> Iterator[None]:
        """The elements moved for the block (already, where `written`), put back after it (bit
        for bit: the input sets stay cached for the next candidate); a device fault leaves them,
        as the context is lost."""
        if not written:
            self.write()
        try:
            yield
        except BaseException as e:
            if not device_fault(e):
                self.put_back()
            raise
        self.put_back()


class TimedCalls:
    """The candidate as the benchmark calls it. Each call on input set i writes output set
    (i + calls so far on i) mod k: the output sets rotate against the input sets every round, so
    a call that skips work (all of it, or part, or only when timed back to back) leaves behind an
    answer to another input set. After the timing every output set is checked against the input
    set it was last written from (float64 where memory allows, `verify.check_method`), every
    guard band, and every input's fingerprint; then one more call on a random set with a few
    elements moved is checked (`_nudged_call`)."""

    def __init__(
        self,
        fn: Any,
        spec: OpSpec,
        m: int,
        n: int,
        dtype: str,
        scalars: list,
        sets: InputSets,
        tally: verify.KernelBenchTally | None = None,
    ) -> None:
        self.fn, self.spec, self.m, self.n, self.dtype, self.scalars = fn, spec, m, n, dtype, scalars
        self.sets, self.tally = sets, tally
        self.k = len(sets.guarded)
        self.index = {s[0].view.data_ptr(): i for i, s in enumerate(sets.guarded)}
        device = str(sets.guarded[0][0].view.device)
        self.outputs = [
            [guarded(t.name, t.shape(m, n), t.torch_dtype(dtype), device) for t in spec.outputs] for _ in range(self.k)
        ]
        for o in self.outputs:
            verify.poison([g_.view for g_ in o])
        self.workspace = guard_workspace(fn, sets.guarded[0][0].view.device)
        self.turns = [0] * self.k
        self.last: list[int | None] = [None] * self.k  # output set o was last written from input set last[o]
        self.failure: str | None = None
        self.check_kind = "timed_output"
        self.method = ""
        self.make_room: Callable[[], None] = lambda: None  # frees what the float64 check may need
        # the candidate's turn at the GPU (inputs read-only, its start and end told: `_candidates_turn`)
        self.turn: Callable[[], AbstractContextManager[None]] = nullcontext
        self.nudge_note = ""  # what the nudged call moved (or why there was none), for the checks' list

    def __call__(self, *ins: torch.Tensor) -> None:
        self._call(self.index[ins[0].data_ptr()], ins)

    def _call(self, i: int, ins: tuple[torch.Tensor, ...] | list[torch.Tensor], o: int | None = None) -> None:
        """The call on input set i (`ins`), into output set `o` (None: its turn in the rotation)."""
        if o is None:
            o = (i + self.turns[i]) % self.k
            self.turns[i] += 1
        self.last[o] = i
        self.fn(*ins, *(g_.view for g_ in self.outputs[o]), *self.scalars)

    def _nudged_call(self, sets: list[list[torch.Tensor]], replay: Callable[[], None] | None = None) -> str | None:
        """One more call, on a random input set with a few elements moved (`Nudge`), its workspace as
        the timing left it, and its output checked: verification poisons the workspace before each
        call, so a kernel keeping its answers there, keyed by the input's address or a sample of it,
        could serve them to the timed calls alone; here it serves the old values' answer. One that
        serves them only to calls that follow closely (it can read the GPU's clock) meets the
        call as it met the timed ones: the timing's own graph again (`replay`), then at once a
        round of calls with the move written meanwhile and the nudged call last (`_tail`). The move
        is one the check sees: the set's answer from the timed calls (checked) must fail it on the
        moved inputs. Made after the timed outputs are checked: it overwrites them."""
        rng = random.SystemRandom()  # (drawn here, each time: nothing a kernel could know)
        i = rng.randrange(self.k)
        held = next((o for o in range(self.k) if self.last[o] == i), None)  # set i's timed answer
        nudge = Nudge.of(sets[i], rng)
        if held is None or nudge is None:
            self.nudge_note = "; no nudged call (no floating input)" if nudge is None else ""
            return None
        rows = nudge.rows if self._by_rows(nudge) else None
        for move in NUDGE_MOVES if rows is not None else NUDGE_MOVES_WHOLE:
            nudge.move = move
            with nudge.moved():
                check = self._checker(sets[i], rows)
                if check(self.outputs[held]) is not None:
                    break
        else:
            self.nudge_note = "; no nudged call (no move of a few elements changes the answer beyond the bound)"
            return None
        self.nudge_note = f"; nudged call: {nudge.where.numel()} elements moved by {nudge.move:+g}, " + (
            "the timing replayed, then a round" if replay is not None else "after a round"
        )
        with self.sets.writable_alias() as alias:  # (outside the candidate's try: its failure is the judge's)
            write = functools.partial(nudge.write, alias(nudge.flat))
            try:
                with self.turn():
                    tail = self._tail(sets, i, held, write)
                    if replay is not None:
                        replay()
                    tail()
            except Exception as e:
                if device_fault(e):
                    raise
                nudge.put_back()
                self.check_kind = "error"
                return f"the call after the timed ones raised {type(e).__name__}: {str(e)[:300]}"
        with nudge.moved(written=True):
            if (name := broken_guard(self.outputs[held] + self.workspace)) is not None:
                self.check_kind = "out_of_bounds_write"
                return f"the nudged call wrote outside {'its scratch workspace' if name == 'workspace' else f'the output `{name}`'}"
            bad = check(self.outputs[held])
        # (the round's calls had the inputs read-only, but a second, writable mapping existed meanwhile)
        if bad is None and (why := self.sets.tampered()) is not None:
            self.check_kind = "input_modified" if "changed during" in why else "out_of_bounds_write"
            return f"after the nudged call: {why}"
        if bad is None:
            return None
        self.check_kind = "stale"
        return (
            f"a call right after the timed ones, its workspace as they left it, on input set {i} of {self.k} with "
            f"{nudge.where.numel()} elements moved by {nudge.move:+g} in place (an answer kept from the timed "
            f"calls?): {bad.describe()}"
        )

    def _tail(
        self, sets: list[list[torch.Tensor]], i: int, o: int, write_nudge: Callable[[], None]
    ) -> Callable[[], None]:
        """The nudged call, made as the timed calls are: a round of calls, set i's first (into
        output set o) and the others' into the other output sets; once set i's is done, the move
        written and o poisoned on a side stream while the others run; then set i's call into o.
        The gap before that call is the timed calls' own, but for one set (the move is made
        between two calls on it). A CUDA graph where the GPU captures one: launched right after the
        timing's own graph, its calls follow the timed ones as those followed each other."""
        order = [i] + [j for j in range(self.k) if j != i]
        slots = [o] + [q for q in range(self.k) if q != o]
        outs = [g_.view for g_ in self.outputs[o]]

        def body(side: torch.cuda.Stream | None) -> None:
            self._call(i, sets[i], o)
            main = torch.cuda.current_stream() if side is not None else None
            if side is not None:
                side.wait_stream(main)
            with torch.cuda.stream(side) if side is not None else nullcontext():
                write_nudge()
                verify.poison(outs)
            for j, q in zip(order[1:], slots[1:]):
                self._call(j, sets[j], q)
            if side is not None:
                main.wait_stream(side)
            self._call(i, sets[i], o)

        if sets[i][0].device.type != "cuda":
            self.nudge_note += ", eagerly"
            return functools.partial(body, None)
        side = torch.cuda.Stream()
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g):
                body(side)
        except Exception:  # noqa: BLE001 - as the timing: a candidate that cannot be captured is called eagerly
            _sync()
            self.nudge_note += ", eagerly"
            return functools.partial(body, side)
        self.nudge_note += ", in a graph"
        return g.replay

    def _by_rows(self, nudge: Nudge) -> bool:
        """Whether the nudged rows can be checked alone: rows independent, and the nudged input's
        first dimension is theirs."""
        return verify.rows_independent(self.spec) and self.spec.inputs[nudge.index].dims[:1] == ("M",)

    def _checker(
        self, ins: list[torch.Tensor], rows: torch.Tensor | None
    ) -> Callable[[list[Guarded]], verify.Mismatch | None]:
        """What checks an output set as the answer to `ins` as they now stand: on `rows` alone, or
        whole. The float64 reference is made once (it serves the held answer and the new one)
        except where the whole shape's does not fit (`verify.check_method`)."""

        def views(outs: list[Guarded]) -> list[torch.Tensor]:
            return [g_.view for g_ in outs]

        def pick(ts: list[torch.Tensor], descs: tuple) -> list[torch.Tensor]:
            return [t[rows] if d.dims[:1] == ("M",) else t for t, d in zip(ts, descs)]

        if rows is not None:
            ref = verify.Reference(self.spec, self.dtype, pick(ins, self.spec.inputs))
            return lambda outs: ref.check(pick(views(outs), self.spec.outputs))
        if verify.check_method(self.spec, ins, views(self.outputs[0])) == "float64":
            whole = verify.Reference(self.spec, self.dtype, ins)
            return lambda outs: whole.check(views(outs))
        return lambda outs: verify.compare_rows(self.spec, self.dtype, ins, views(outs))

    def check(self, sets: list[list[torch.Tensor]], replay: Callable[[], None] | None = None) -> str | None:
        """What is wrong with what the timed calls did (None: nothing). `replay`: the timing's
        calls made again as timed (its graph), for the nudged call to follow."""
        _sync()
        self.failure = self._check(sets, replay)
        return self.failure

    def _check(self, sets: list[list[torch.Tensor]], replay: Callable[[], None] | None) -> str | None:
        if (why := self.sets.tampered()) is not None:
            self.check_kind = "input_modified" if "changed during" in why else "out_of_bounds_write"
            return why
        for o, outs in enumerate(self.outputs):
            if (name := broken_guard(outs)) is not None:
                self.check_kind = "out_of_bounds_write"
                return f"the timed calls wrote outside the output `{name}` (output set {o})"
        if broken_guard(self.workspace) is not None:
            self.check_kind = "out_of_bounds_write"
            return "the timed calls wrote outside their scratch workspace"
        methods = set()
        for o, outs in enumerate(self.outputs):
            i = self.last[o]
            if i is None:
                return f"the timed calls never wrote output set {o}"
            views = [g_.view for g_ in outs]
            if verify.check_method(self.spec, sets[i], views) == "torch's own output":
                self.make_room()
            methods.add(verify.check_method(self.spec, sets[i], views))
            bad = verify.compare_rows(self.spec, self.dtype, sets[i], views, tally=self.tally)
            if bad is not None:
                return f"output set {o}, last written from input set {i} of {self.k}: {bad.describe()}"
        self.method = ", ".join(sorted(methods))
        return self._nudged_call(sets, replay)

    def release(self) -> None:
        self.outputs, self.workspace = [], []
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
