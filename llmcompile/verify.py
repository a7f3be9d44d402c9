"""Output checking against a float64 reference: the numeric core of the verify stage."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from llmcompile.ops import OpSpec, Tolerance

# A kernel may round differently from torch (another accumulation order), but not by much
# more than torch itself errs on the same inputs, nor more than fp32 arithmetic can on terms
# of these magnitudes: each output element's absolute tolerance grows by the larger of
# OWN_ERROR_FACTOR x torch's own worst error on that output (in the problem's dtype, against
# float64) and MAGNITUDE_FACTOR x fp32's unit roundoff x the reference evaluated on |inputs|
# (for a sum, the sum of its terms' magnitudes). A column sum over 65537 fp32 rows in row
# order that cancels terms ~250x its value errs at 1e-4 relative: no fixed rtol is fair to it.
OWN_ERROR_FACTOR = 8.0
MAGNITUDE_FACTOR = 4.0
FP32_ROUNDOFF = 2.0**-24
# KernelBench's verdict: torch.allclose of the kernel's output and the problem's own torch
# output (same dtype), recorded beside ours so results compare with published ones.
KERNELBENCH_TOL = Tolerance(1e-2, 1e-2)


@dataclass
class KernelBenchTally:
    """KernelBench's verdict over every comparison (a call's outputs, or a chunk of their rows)."""

    checked: int = 0
    passed: int = 0
    first_failure: str = ""

    @property
    def ok(self) -> bool | None:
        return None if not self.checked else self.passed == self.checked

    def add(self, ok: bool) -> None:
        self.checked += 1
        self.passed += ok
        if not ok and not self.first_failure:
            self.first_failure = f"outputs differ from torch's by more than atol=rtol={KERNELBENCH_TOL.atol}"

    def as_dict(self) -> dict:
        return {"checked": self.checked, "passed": self.passed, "first_failure": self.first_failure}


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


def torch_own(spec: OpSpec, inputs: list[torch.Tensor], scalars: dict | None = None) -> list[torch.Tensor] | None:
    """The problem's own torch program on `inputs` in their dtype (None when the spec has none)."""
    if spec.torch_fn is None:
        return None
    vals = {**spec.scalars, **(scalars or {})}
    with torch.no_grad():
        out = spec.torch_fn(*inputs, *vals.values())
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _worst_error(a: torch.Tensor, r: torch.Tensor) -> float:
    finite = torch.isfinite(a) & torch.isfinite(r)
    return float((a - r).abs()[finite].max()) if bool(finite.any()) else 0.0


def _magnitudes(spec: OpSpec, inputs: list[torch.Tensor], scalars: dict | None) -> list[torch.Tensor]:
    """The float64 reference on the inputs' magnitudes (|x| for floating inputs)."""
    absolute = [x.abs() if x.is_floating_point() else x for x in inputs]
    return [m.double().abs().nan_to_num(0.0, 0.0, 0.0) for m in spec.run_reference(absolute, **(scalars or {}))]


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


def _close(g: torch.Tensor, r: torch.Tensor, tol: Tolerance, slack: float | torch.Tensor) -> torch.Tensor:
    # isclose treats inf == inf of the same sign as close, which is right
    if isinstance(slack, float):
        return torch.isclose(g, r, rtol=tol.rtol, atol=tol.atol + slack, equal_nan=True)
    within = (g - r).abs() <= tol.atol + tol.rtol * r.abs() + slack
    return torch.isclose(g, r, rtol=tol.rtol, atol=tol.atol, equal_nan=True) | within


def compare(
    spec: OpSpec,
    dtype: str,
    inputs: list[torch.Tensor],
    outputs: list[torch.Tensor],
    scalars: dict | None = None,
    tally: KernelBenchTally | None = None,
) -> Mismatch | None:
    """None if every output matches the float64 reference within the spec's tolerance, widened
    where torch's own error or the terms' magnitudes say an honest kernel errs more (see
    OWN_ERROR_FACTOR). `tally` records KernelBench's verdict on the same outputs."""
    own = torch_own(spec, inputs, scalars)  # first: its temporaries are freed before the reference's
    if tally is not None and own is not None:
        _kernelbench_check(outputs, own, tally)
    mags = _magnitudes(spec, inputs, scalars)
    refs = spec.run_reference(inputs, **(scalars or {}))
    tol = spec.tol(dtype)
    for k, (desc, got, ref) in enumerate(zip(spec.outputs, outputs, refs)):
        g = got.double()
        r = ref.to(g.device).double().reshape(g.shape)
        slack: float | torch.Tensor = 0.0
        if own is not None and k < len(own) and own[k].is_floating_point():
            slack = OWN_ERROR_FACTOR * _worst_error(own[k].to(g.device).double().reshape(g.shape), r)
        if g.is_floating_point() and k < len(mags):
            slack = torch.clamp(MAGNITUDE_FACTOR * FP32_ROUNDOFF * mags[k].to(g.device).reshape(g.shape), min=slack)
        ok = _close(g, r, tol, slack)
        if bool(ok.all()):
            continue
        bad = (~ok).nonzero()
        first = tuple(int(i) for i in bad[0])
        unwritten = int(poisoned(got).reshape(g.shape).sum())
        finite = torch.isfinite(g) & torch.isfinite(r)
        err = float((g - r).abs()[finite].max()) if bool(finite.any()) else float("nan")
        return Mismatch(
            desc.name, first, float(r[first]), float(g[first]), int(bad.shape[0]), g.numel(), unwritten, err
        )
    return None


# Rows compared at once against the float64 reference: bounds the reference's memory at any size.
CHUNK_ELEMS = 1 << 24


def rows_independent(spec: OpSpec) -> bool:
    """Whether chunks of rows (of M) can be checked on their own: every output has M rows, each
    depending on its own input rows only (not a sum over the rows, as a norm backward's dw),
    and the op's leading dims flatten into M or a problem is batchable."""
    rows_only = spec.independent_rows and all(d.dims[:1] == ("M",) for d in spec.outputs)
    return rows_only and (spec.flat_rows or spec.batchable)


def compare_own(
    spec: OpSpec,
    dtype: str,
    inputs: list[torch.Tensor],
    outputs: list[torch.Tensor],
    chunk_elems: int = CHUNK_ELEMS,
    tally: KernelBenchTally | None = None,
) -> Mismatch | None:
    """The outputs against the problem's own torch output in its dtype, compared in chunks of
    elements: the check of timed outputs where rows are not independent, at sizes whose float64
    reference would not fit beside them (the float64 check ran at the verified sizes)."""
    own = torch_own(spec, inputs)
    if own is None:
        return compare(spec, dtype, inputs, outputs, tally=tally)
    tol = spec.tol(dtype)
    kb_ok = True
    for desc, got, ref in zip(spec.outputs, outputs, own):
        flat_g, flat_r = got.reshape(-1), ref.to(got.device).reshape(-1)
        for lo in range(0, flat_g.numel(), chunk_elems):
            g, r = flat_g[lo : lo + chunk_elems].double(), flat_r[lo : lo + chunk_elems].double()
            kb_ok &= bool(_close(g, r, KERNELBENCH_TOL, 0.0).all())
            ok = _close(g, r, tol, 0.0)
            if bool(ok.all()):
                continue
            if tally is not None:
                tally.add(kb_ok)
            bad = (~ok).nonzero()
            i = int(bad[0, 0])
            unwritten = int(poisoned(flat_g[lo : lo + chunk_elems]).sum())
            err = _worst_error(g, r)
            index = tuple(int(x) for x in torch.unravel_index(torch.tensor(lo + i), got.shape)) if got.dim() else ()
            return Mismatch(
                f"{desc.name} (against torch's own output)",
                index,
                float(r[i]),
                float(g[i]),
                int(bad.shape[0]),
                g.numel(),
                unwritten,
                err,
            )
    if tally is not None:
        tally.add(kb_ok)
    return None


def compare_rows(
    spec: OpSpec,
    dtype: str,
    inputs: list[torch.Tensor],
    outputs: list[torch.Tensor],
    chunk_elems: int = CHUNK_ELEMS,
    tally: KernelBenchTally | None = None,
) -> Mismatch | None:
    """`compare` over chunks of rows where rows are independent: the float64 copies then never
    exceed a chunk, however large the tensors. Otherwise `compare_own`."""
    if not rows_independent(spec):
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
