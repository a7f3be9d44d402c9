"""Output checking against a float64 reference: the numeric core of the verify stage.

The rule (docs/judge.md): each output element may differ from the float64 reference by

    atol + rtol * |ref| + max(OWN_ERROR_FACTOR * torch's own worst error on that output,
                              u * (MAGNITUDE_FACTOR * |terms| + ORDER_FACTOR * sqrt(K) * |ref|),
                              SENSITIVITY_FACTOR * |f(x') - f(x)|)

u is fp32's unit roundoff (kernels accumulate in fp32 whatever they load), |terms| the float64
reference evaluated on the inputs' magnitudes (for a sum, the sum of its terms' magnitudes) and K
the reduction's length behind that output (input elements per output element). An honest
reduction in any order errs less: in fp32 a sum of K terms in any order errs about u * |terms|
where they cancel, and where they drift one way (x^2, a nonzero mean) the partial sums grow with
the result, and one thread walking all K terms in sequence errs up to 1.4 * u * sqrt(K) * |ref|
(the worst honest order measured, K = 131072; tests/honest_reductions.py measures every order).
No tolerance fair to that order can see one skipped term among 131072 same-sign ones, so the
verify stage also runs inputs on which skipped work shows plainly: spikes at every edge and at
random places (a term many times the rest), and, for ops whose every honest order is exact on
small integers (`OpSpec.exact`), small integers whose sums fp32 holds exactly, compared with
`exact_tolerance`: one output rounding for a sum or a max ("sum"), and EXACT_FACTOR * u * |terms|
more where a division or square root ends it (a mean, a norm: "divided").

Where the op amplifies its reductions' rounding (a std / mean whose mean is near 0: a rounding
of the mean by u |x| moves it by u |x| std / mean^2), |terms| says nothing of it, so an output
may also differ by what moving the inputs by as much moves the float64 reference, |f(x') - f(x)|
with x' = x + u |x| (1 + r), r = +-1 at random (a fixed seed): the magnitudes' drift that a
fold's rounding follows, and a random part where the op's gradient has mixed signs. An honest
kernel computes f(x + dx) for some |dx| of a few u |x| (it is backward stable), so an element
the reference barely moves gets no more room than before. That run is made only for outputs the
rest of the rule rejects (it can only widen the bound): the verify stage's time is unchanged
wherever they pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from llmcompile.specs import OpSpec, Tolerance

# torch's own error on the same inputs, in the problem's dtype against float64, widens each
# output's tolerance this much: an honest kernel may round like torch does
OWN_ERROR_FACTOR = 8.0
# u x (MAGNITUDE_FACTOR x |terms| + ORDER_FACTOR x sqrt(K) x |ref|): the arithmetic's own bound.
# A column sum over 65537 fp32 rows in row order that cancels terms ~250x its value errs at 0.5 u
# |terms| (1e-4 relative: no fixed rtol is fair to it; tests/test_verify.py); one thread summing
# 131072 squares in sequence at 1.4 u sqrt(K) |ref|. An fp16 accumulator errs 60-260 u |terms|.
MAGNITUDE_FACTOR = 4.0
ORDER_FACTOR = 4.0
FP32_ROUNDOFF = 2.0**-24
# x SENSITIVITY_FACTOR what moving the inputs by u |x| moves the reference by: every honest order
# of a std / mean (kind "cv" of tests/honest_reductions.py, 2^27 elements, H200) came within 0.36
# of the bound with it; without it, the norm template's 32-64-thread fold of 1024 fp32 failed
SENSITIVITY_FACTOR = 4.0
SENSITIVITY_SEED = 0x5E45
# on inputs where every honest order is exact, what divisions and merges may still round: a mean
# by Chan's merges of (count, mean) over 4096 integers errs 0.7 u x |terms| (tests/honest_reductions.py)
EXACT_FACTOR = 4.0
_MANTISSA = {torch.float32: 23, torch.bfloat16: 7, torch.float16: 10, torch.float64: 52}
# KernelBench's verdict: torch.allclose of the kernel's output and the problem's own torch
# output (same dtype), recorded beside ours so results compare with published ones.
KERNELBENCH_TOL = Tolerance(1e-2, 1e-2)


@dataclass
class KernelBenchTally:
    """KernelBench's verdict over every comparison (a call's outputs, or a chunk of their rows)."""

    checked: int = 0
    passed: int = 0
    first_failure: str = ""
    torch_failed: str = ""  # why there was nothing to check against: torch's own program raised

    @property
    def ok(self) -> bool | None:
        return None if not self.checked else self.passed == self.checked

    def add(self, ok: bool) -> None:
        self.checked += 1
        self.passed += ok
        if not ok and not self.first_failure:
            self.first_failure = f"outputs differ from torch's by more than atol=rtol={KERNELBENCH_TOL.atol}"

    def as_dict(self) -> dict:
        d = {"checked": self.checked, "passed": self.passed, "first_failure": self.first_failure}
        return {**d, "torch_failed": self.torch_failed} if self.torch_failed else d


@dataclass(frozen=True)
class Mismatch:
    output: str
    index: tuple[int, ...]
    expected: float
    got: float
    count: int  # how many elements of this output are off
    total: int
    unwritten: int  # elements still holding the poison
    max_abs_err: float

    def describe(self) -> str:
        what = f"{self.count} of {self.total} elements of `{self.output}` are wrong"
        if self.unwritten:
            what += f" ({self.unwritten} never written: still the NaN poison)"
        return f"{what}; first at index {list(self.index)}: expected {self.expected:.6g}, got {self.got:.6g}"


# A NaN with a payload no arithmetic produces (GPUs return the canonical NaN), so "never
# written" and "computed a NaN" are told apart by the bits.
_POISON_BITS = {
    torch.float32: (torch.int32, 0x7FC0DEAD),
    torch.bfloat16: (torch.int16, 0x7FDE),
    torch.float16: (torch.int16, 0x7EDE),
    torch.float64: (torch.int64, 0x7FF8DEADDEADDEAD),
}
_INT_POISON = -0x5EED


def poison(outputs: list[torch.Tensor]) -> None:
    for o in outputs:
        if o.dtype in _POISON_BITS:
            itype, bits = _POISON_BITS[o.dtype]
            o.view(itype).fill_(bits)
        else:
            o.fill_(_INT_POISON)


def poisoned(t: torch.Tensor) -> torch.Tensor:
    """Where `t` still holds the poison."""
    if t.dtype in _POISON_BITS:
        itype, bits = _POISON_BITS[t.dtype]
        return t.view(itype) == bits
    return t == _INT_POISON


class TorchProgramFailed(RuntimeError):
    """The problem's own torch program raised (torch refuses a bf16 LayerNorm with fp32 parameters
    on the GPU): no output of torch's to compare with; the float64 reference still judges."""


class CannotCheck(RuntimeError):
    """The judge has no way to check these outputs (its limit, never the candidate's fault)."""


def torch_own(spec: OpSpec, inputs: list[torch.Tensor], scalars: dict | None = None) -> list[torch.Tensor] | None:
    """The problem's own torch program on `inputs` in their dtype (None when the spec has none);
    TorchProgramFailed where it raises (out of memory is the judge's plan's failure: raised as is)."""
    if spec.torch_fn is None:
        return None
    vals = {**spec.scalars, **(scalars or {})}
    try:
        with torch.no_grad():
            out = spec.torch_fn(*inputs, *vals.values())
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - any error of the problem's own code
        raise TorchProgramFailed(f"the problem's own torch program raised {type(e).__name__}: {str(e)[:200]}") from e
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _worst_error(a: torch.Tensor, r: torch.Tensor) -> float:
    finite = torch.isfinite(a) & torch.isfinite(r)
    return float((a - r).abs()[finite].max()) if bool(finite.any()) else 0.0


def _magnitudes(spec: OpSpec, inputs: list[torch.Tensor], scalars: dict | None) -> list[torch.Tensor]:
    """The float64 reference on the inputs' magnitudes (|x| for floating inputs)."""
    absolute = [x.abs() if x.is_floating_point() else x for x in inputs]
    return [m.double().abs().nan_to_num(0.0, 0.0, 0.0) for m in spec.run_reference(absolute, **(scalars or {}))]


def _moved(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """x in float64 moved by u |x| (1 + r), r = +-1 at random: each element up by 0 or 2u of its
    magnitude (a copy even where x is float64 already: the judge's inputs are read-only)."""
    up = x.to(torch.float64, copy=True)
    r = torch.empty_like(up).bernoulli_(0.5, generator=gen)
    up.addcmul_(up.abs(), r, value=2 * FP32_ROUNDOFF)
    return up


def _sensitivity(
    spec: OpSpec, inputs: list[torch.Tensor], scalars: dict | None, refs: list[torch.Tensor]
) -> list[torch.Tensor | None]:
    """|f(x') - f(x)| of each floating output, x' the floating inputs moved (`_moved`). Infinite
    where the reference is inf or NaN and the moved one finite (a division by an exact 0: a mean
    of integers that cancel, a constant row's std, which a fold that rounds its mean makes tiny,
    not 0); 0 where the moved one is not finite. None for an integer output, or where no input
    is floating."""
    if not any(x.is_floating_point() for x in inputs):
        return [None] * len(refs)
    gen = torch.Generator(device=inputs[0].device).manual_seed(SENSITIVITY_SEED)
    moved = [_moved(x, gen) if x.is_floating_point() else x for x in inputs]
    outs: list[torch.Tensor | None] = list(spec.run_reference(moved, **(scalars or {})))
    del moved
    sens: list[torch.Tensor | None] = []
    for k, r in enumerate(refs):
        p, outs[k] = outs[k], None  # (each moved output freed once its difference is made)
        ok = p is not None and p.is_floating_point() and r.is_floating_point()
        if not ok:
            sens.append(None)
            continue
        p, r = p.double(), r.to(p.device).double()
        d = (p - r).abs_()
        d.masked_fill_(~torch.isfinite(d), 0.0).masked_fill_(torch.isfinite(p) & ~torch.isfinite(r), float("inf"))
        sens.append(d)
    return sens


def _kernelbench_check(outputs: list[torch.Tensor], own: list[torch.Tensor], tally: KernelBenchTally) -> None:
    # in the outputs' own dtype, as KernelBench compares (no float64 copy of a large output)
    ok = all(
        torch.allclose(
            got,
            o.to(got.device, got.dtype).reshape(got.shape),
            rtol=KERNELBENCH_TOL.rtol,
            atol=KERNELBENCH_TOL.atol,
            equal_nan=True,
        )
        for got, o in zip(outputs, own)
    )
    tally.add(ok)


def reduction_length(spec: OpSpec, inputs: list[torch.Tensor], output: torch.Tensor) -> int:
    """K: how many input elements stand behind each element of `output` (1 for an elementwise
    op or a row-wise rewrite such as softmax, N for a row sum, M for a column sum)."""
    first = next((x for x in inputs if x.is_floating_point()), inputs[0])
    return max(1, first.numel() // max(1, output.numel()))


def order_slack(mags: torch.Tensor, ref: torch.Tensor, k: int) -> torch.Tensor:
    """What any honest fp32 order of a K-term reduction may err by, given |terms| and the
    result (see the top of this module)."""
    return FP32_ROUNDOFF * (MAGNITUDE_FACTOR * mags + ORDER_FACTOR * math.sqrt(k) * ref.abs().nan_to_num(0.0, 0.0, 0.0))


def ulp(r: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of `dtype`'s numbers at |r| (float64): one rounding of r into that dtype is
    within half of it. 0 at r = 0."""
    a = r.abs()
    exp = torch.floor(torch.log2(torch.where(a > 0, a, 1.0)))
    return torch.where(a > 0, torch.exp2(exp - _MANTISSA.get(dtype, 23)), 0.0)


EXACT_KINDS = ("sum", "divided")


def exact_tolerance(r: torch.Tensor, mags: torch.Tensor, out_dtype: torch.dtype, kind: str) -> torch.Tensor:
    """On inputs whose every honest order is exact (small integers summed in fp32): one rounding
    into the output dtype (a whole ulp); for a "divided" op (a mean, a norm) also what a division,
    a square root or a merge of running means may add (EXACT_FACTOR x u x |terms|)."""
    if kind not in EXACT_KINDS:
        raise ValueError(f"exactness {kind!r} is none of {EXACT_KINDS}")
    return ulp(r, out_dtype) + (EXACT_FACTOR * FP32_ROUNDOFF * mags if kind == "divided" else 0.0)


def _close(g: torch.Tensor, r: torch.Tensor, tol: Tolerance, slack: float | torch.Tensor) -> torch.Tensor:
    # isclose treats inf == inf of the same sign as close, which is right; an infinite reference
    # admits only itself (rtol x inf would admit anything but NaN), unless its slack is infinite
    # (`_sensitivity`: a rounding of the inputs makes it finite)
    if isinstance(slack, float):
        return torch.isclose(g, r, rtol=tol.rtol, atol=tol.atol + slack, equal_nan=True)
    within = ((g - r).abs() <= tol.atol + tol.rtol * r.abs() + slack) & torch.isfinite(r)
    return torch.isclose(g, r, rtol=tol.rtol, atol=tol.atol, equal_nan=True) | within | _singular(g, r, slack)


def _singular(g: torch.Tensor, r: torch.Tensor, slack: torch.Tensor) -> torch.Tensor:
    """Where the reference is inf or NaN but a rounding of the inputs makes it finite (`_sensitivity`'s
    infinite slack: a division by an exact 0): any value passes, but a NaN where the reference is
    an inf."""
    return torch.isinf(slack) & ~torch.isfinite(r) & ~(torch.isnan(g) & torch.isinf(r))


def _exact_close(g: torch.Tensor, r: torch.Tensor, bound: torch.Tensor) -> torch.Tensor:
    same_nan = torch.isnan(g) & torch.isnan(r)
    return same_nan | (g == r) | (((g - r).abs() <= bound) & torch.isfinite(r))


def _mismatch(name: str, got: torch.Tensor, g: torch.Tensor, r: torch.Tensor, ok: torch.Tensor) -> Mismatch:
    bad = (~ok).nonzero()
    first = tuple(int(i) for i in bad[0])
    unwritten = int(poisoned(got).reshape(g.shape).sum())
    err = _worst_error(g, r)
    return Mismatch(name, first, float(r[first]), float(g[first]), int(bad.shape[0]), g.numel(), unwritten, err)


class Reference:
    """The float64 reference of one call's inputs, made once, and what each output may differ
    from it by (the rule at the top of this module); `check` and `ratio` read outputs against it."""

    def __init__(
        self,
        spec: OpSpec,
        dtype: str,
        inputs: list[torch.Tensor],
        scalars: dict | None = None,
        widen_by_own: bool = True,
    ) -> None:
        self.spec, self.dtype, self.inputs, self.scalars = spec, dtype, inputs, scalars
        self.widen_by_own = widen_by_own
        # torch's own run first: its temporaries are freed before the reference's
        self.own_failed = ""
        try:
            self.own = torch_own(spec, inputs, scalars)
        except TorchProgramFailed as e:
            self.own, self.own_failed = None, str(e)
        self.own_errs: list[float | None] = []
        self.mags = _magnitudes(spec, inputs, scalars)
        self.refs = spec.run_reference(inputs, **(scalars or {}))
        self._sens: list[torch.Tensor | None] | None = None  # (made when first needed: `moved`)
        for k, ref in enumerate(self.refs):
            own = self.own[k] if self.own is not None and k < len(self.own) else None
            use = widen_by_own and own is not None and own.is_floating_point()
            self.own_errs.append(
                _worst_error(own.double().reshape(ref.shape).to(ref.device), ref.double()) if use else None
            )

    def _pair(self, k: int, got: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        g = got.double()
        return g, self.refs[k].to(g.device).double().reshape(g.shape)

    def moved(self) -> list[torch.Tensor | None]:
        """|f(x') - f(x)| of each output (`_sensitivity`), made once, when a check first needs it:
        it only widens the bound, so outputs within the rest of the rule never pay its run."""
        if self._sens is None:
            self._sens = _sensitivity(self.spec, self.inputs, self.scalars, self.refs)
        return self._sens

    def allowed(self, k: int, got: torch.Tensor, exact: str = "", moved: bool = True) -> torch.Tensor:
        """What output k may differ from the reference by, element by element, beyond the spec's
        own atol + rtol |ref|; with `exact` (an OpSpec.exact kind), all it may differ by.
        `moved=False`: without the sensitivity term (a lower bound)."""
        g, r = self._pair(k, got)
        return self._slack(k, g, r, got.dtype, exact, moved)

    def _slack(
        self, k: int, g: torch.Tensor, r: torch.Tensor, dtype: torch.dtype, exact: str, moved: bool
    ) -> torch.Tensor:
        """`allowed` on the float64 pair already made (g: the output, r: the reference)."""
        mag = self.mags[k].to(g.device).reshape(g.shape) if k < len(self.mags) else None
        if exact and g.is_floating_point() and mag is not None:
            return exact_tolerance(r, mag, dtype, exact)
        slack = torch.full_like(r, OWN_ERROR_FACTOR * (self.own_errs[k] or 0.0))
        if g.is_floating_point() and mag is not None:
            slack = torch.maximum(order_slack(mag, r, reduction_length(self.spec, self.inputs, g)), slack)
        sens = self.moved()[k] if moved and g.is_floating_point() else None
        if sens is not None:
            slack = torch.maximum(SENSITIVITY_FACTOR * sens.to(g.device).reshape(g.shape), slack)
        return slack

    def as_torch_overflows(self, k: int, g: torch.Tensor) -> torch.Tensor | bool:
        """Where output k is the inf or NaN torch's own run gives in the problem's dtype (a
        product past fp32's range, whose float64 reference is finite): no honest kernel in that
        dtype does better, so those elements pass. False where torch's run is finite throughout."""
        use = self.widen_by_own and self.own is not None and k < len(self.own) and self.own[k].is_floating_point()
        if not use or bool(torch.isfinite(self.own[k]).all()):
            return False
        o = self.own[k].to(g.device).double().reshape(g.shape)
        return ~torch.isfinite(o) & ((g == o) | (torch.isnan(g) & torch.isnan(o)))

    def _ok(self, k: int, got: torch.Tensor, exact: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        g, r = self._pair(k, got)
        if exact and g.is_floating_point():
            bound = self._slack(k, g, r, got.dtype, exact, moved=False)
            return g, r, _exact_close(g, r, bound) | self.as_torch_overflows(k, g)
        tol = self.spec.tol(self.dtype)
        for moved in (False, True):  # (the sensitivity run only where the rest of the rule fails)
            ok = _close(g, r, tol, self._slack(k, g, r, got.dtype, exact, moved)) | self.as_torch_overflows(k, g)
            if bool(ok.all()) or not g.is_floating_point():
                break
        return g, r, ok

    def check(self, outputs: list[torch.Tensor], exact: str = "") -> Mismatch | None:
        """None if every output is within what it may differ by; else the first that is not."""
        for k, (desc, got) in enumerate(zip(self.spec.outputs, outputs)):
            g, r, ok = self._ok(k, got, exact)
            if not bool(ok.all()):
                return _mismatch(desc.name, got, g, r, ok)
        return None

    def ratio(self, outputs: list[torch.Tensor], exact: str = "") -> float:
        """The largest |output - reference| over what that element may differ by (the verdict's
        margin: under 1 passes, over 1 fails; NaN where the reference is NaN counts 0, and an
        output NaN or inf where the reference is finite, inf)."""
        worst = 0.0
        for k, got in enumerate(outputs):
            g, r = self._pair(k, got)
            slack = self._slack(k, g, r, got.dtype, exact, moved=True)
            is_exact = bool(exact) and g.is_floating_point()
            bound = slack
            if not is_exact:
                tol = self.spec.tol(self.dtype)
                bound = tol.atol + tol.rtol * r.abs() + slack
            same = (g == r) | (torch.isnan(g) & torch.isnan(r)) | self.as_torch_overflows(k, g)
            # (as `_close`: an infinite reference admits itself, or any value but NaN where a
            # rounding of the inputs makes it finite, and nothing else)
            free = False if is_exact else _singular(g, r, slack)
            err = torch.where(same | free, 0.0, torch.where(torch.isinf(r), float("inf"), (g - r).abs()))
            q = torch.where(err == 0, 0.0, torch.where(bound > 0, err / bound.clamp(min=1e-300), float("inf")))
            worst = max(worst, float(q.nan_to_num(float("inf")).max()) if q.numel() else 0.0)
        return worst


def compare(
    spec: OpSpec,
    dtype: str,
    inputs: list[torch.Tensor],
    outputs: list[torch.Tensor],
    scalars: dict | None = None,
    tally: KernelBenchTally | None = None,
    exact: str = "",
    widen_by_own: bool = True,
) -> Mismatch | None:
    """None if every output matches the float64 reference within the rule at the top of this
    module. `exact` ("sum" or "divided", spec.exact): the inputs are ones on which every honest
    order of `spec` is exact (its "integers" case), so floating outputs get `exact_tolerance`.
    `widen_by_own=False` leaves torch's own error out of the bound (to ask whether torch itself
    meets it). `tally` records KernelBench's verdict on the same outputs."""
    ref = Reference(spec, dtype, inputs, scalars, widen_by_own)
    if tally is not None and ref.own is not None:
        _kernelbench_check(outputs, ref.own, tally)
    elif tally is not None and ref.own_failed:
        tally.torch_failed = ref.own_failed
    return ref.check(outputs, exact)


# Rows compared at once against the float64 reference: bounds the reference's memory at any size.
CHUNK_ELEMS = 1 << 24


def rows_independent(spec: OpSpec) -> bool:
    """Whether chunks of rows (of M) can be checked on their own: every output has M rows, each
    depending on its own input rows only (not a sum over the rows, as a norm backward's dw),
    and the op's leading dims flatten into M or a problem is batchable."""
    rows_only = spec.independent_rows and all(d.dims[:1] == ("M",) for d in spec.outputs)
    return rows_only and (spec.flat_rows or spec.batchable)


def reference_bytes(spec: OpSpec, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> int:
    """GPU bytes `compare` holds at once on these tensors: inputs and outputs in float64, the
    reference three times (on the values, on their magnitudes, on them moved), the comparison's
    temporaries."""
    elems = sum(x.numel() for x in inputs) + 3 * sum(o.numel() for o in outputs)
    return 3 * 8 * elems + spec.reference_scratch


def compare_own(
    spec: OpSpec,
    dtype: str,
    inputs: list[torch.Tensor],
    outputs: list[torch.Tensor],
    chunk_elems: int = CHUNK_ELEMS,
    tally: KernelBenchTally | None = None,
) -> Mismatch | None:
    """The outputs against the problem's own torch output in its dtype, in chunks of elements,
    with the arithmetic's bound twice over (torch's rounding and the kernel's), its magnitudes
    from torch's own run on |inputs|: the check of timed outputs where rows are not independent
    and the float64 reference of the whole shape does not fit the GPU. Its mismatches say so."""
    try:
        own = torch_own(spec, inputs)
    except TorchProgramFailed as e:
        # the float64 reference was ruled out before this (it does not fit), and running it now
        # would run the failing program again first: the judge cannot check these outputs
        raise CannotCheck(f"the timed outputs cannot be checked: {e}, and the float64 reference does not fit") from e
    if own is None:
        return compare(spec, dtype, inputs, outputs, tally=tally)
    mags = torch_own(spec, [x.abs() if x.is_floating_point() else x for x in inputs]) or []
    tol = spec.tol(dtype)
    kb_ok = True
    for k, (desc, got, ref) in enumerate(zip(spec.outputs, outputs, own)):
        flat_g, flat_r = got.reshape(-1), ref.to(got.device).reshape(-1)
        mag = mags[k].reshape(-1) if k < len(mags) and got.is_floating_point() else None
        klen = reduction_length(spec, inputs, got)
        for lo in range(0, flat_g.numel(), chunk_elems):
            g, r = flat_g[lo : lo + chunk_elems].double(), flat_r[lo : lo + chunk_elems].double()
            kb_ok &= bool(_close(g, r, KERNELBENCH_TOL, 0.0).all())
            slack: float | torch.Tensor = 0.0
            if mag is not None:
                m = mag[lo : lo + chunk_elems].to(g.device).double().abs().nan_to_num(0.0, 0.0, 0.0)
                slack = 2 * order_slack(m, r, klen)
            # (torch's own inf is no truth: an fp32 product can overflow part way where a kernel
            # that rescales does not, so any value but NaN passes there, as before)
            ok = _close(g, r, tol, slack) | (torch.isinf(r) & ~torch.isnan(g))
            if bool(ok.all()):
                continue
            if tally is not None:
                tally.add(kb_ok)
            bad = _mismatch(f"{desc.name} (against torch's own output)", flat_g[lo : lo + chunk_elems], g, r, ok)
            index = (
                tuple(int(x) for x in torch.unravel_index(torch.tensor(lo + bad.index[0]), got.shape))
                if got.dim()
                else ()
            )
            return replace(bad, index=index)
    if tally is not None:
        tally.add(kb_ok)
    return None


def check_method(
    spec: OpSpec, inputs: list[torch.Tensor], outputs: list[torch.Tensor], free_bytes: int | None = None
) -> str:
    """How `compare_rows` checks these outputs: "float64 by rows" (each chunk of rows against
    its own float64 reference), "float64" (the whole shape's float64 reference, where it fits
    `free_bytes`, by default the device's free memory), or "torch's own output" (where neither
    does: `compare_own`)."""
    if rows_independent(spec):
        return "float64 by rows"
    need = reference_bytes(spec, inputs, outputs)
    if free_bytes is None:
        dev = outputs[0].device if outputs else inputs[0].device
        free_bytes = torch.cuda.mem_get_info(dev)[0] if dev.type == "cuda" else need
    return "float64" if need <= 0.8 * free_bytes else "torch's own output"


def compare_rows(
    spec: OpSpec,
    dtype: str,
    inputs: list[torch.Tensor],
    outputs: list[torch.Tensor],
    chunk_elems: int = CHUNK_ELEMS,
    tally: KernelBenchTally | None = None,
    free_bytes: int | None = None,
) -> Mismatch | None:
    """The outputs of a large call against float64, by `check_method`: in chunks of rows where
    rows are independent (the float64 copies never exceed a chunk, however large the tensors),
    else the whole shape where its reference fits, else `compare_own`."""
    method = check_method(spec, inputs, outputs, free_bytes)
    if method == "float64":
        return compare(spec, dtype, inputs, outputs, tally=tally)
    if method != "float64 by rows":
        return compare_own(spec, dtype, inputs, outputs, chunk_elems, tally)
    m = inputs[0].shape[0]
    rows = max(1, chunk_elems // max(1, inputs[0][:1].numel()))

    def rows_of(t: torch.Tensor, desc_dims: tuple[str, ...], lo: int, hi: int) -> torch.Tensor:
        return t[lo:hi] if desc_dims and desc_dims[0] == "M" else t

    for lo in range(0, m, rows):
        hi = min(m, lo + rows)
        ins = [rows_of(t, d.dims, lo, hi) for t, d in zip(inputs, spec.inputs)]
        outs = [rows_of(t, d.dims, lo, hi) for t, d in zip(outputs, spec.outputs)]
        bad = compare(spec, dtype, ins, outs, tally=tally)
        if bad is not None:
            index = (bad.index[0] + lo, *bad.index[1:]) if bad.index else bad.index
            return replace(bad, output=f"{bad.output}[{lo}:{hi}]", index=index)  # counts are the chunk's
    return None
