"""Output checking against a float64 reference: the numeric core of the verify stage."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from llmcompile.ops import OpSpec


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


def compare(
    spec: OpSpec, dtype: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor], scalars: dict | None = None
) -> Mismatch | None:
    """None if every output matches the float64 reference within the spec's tolerance."""
    refs = spec.run_reference(inputs, **(scalars or {}))
    tol = spec.tol(dtype)
    for desc, got, ref in zip(spec.outputs, outputs, refs):
        g = got.double()
        r = ref.to(g.device).double().reshape(g.shape)
        ok = torch.isclose(g, r, rtol=tol.rtol, atol=tol.atol, equal_nan=True)
        # isclose treats inf == inf of the same sign as close, which is right
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
    """Whether chunks of rows (of M) can be checked on their own: the op's leading dims flatten
    into M, or a problem means the same at any M and every output has M rows."""
    return spec.flat_rows or (spec.batchable and all(d.dims[:1] == ("M",) for d in spec.outputs))


def compare_rows(
    spec: OpSpec, dtype: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor], chunk_elems: int = CHUNK_ELEMS
) -> Mismatch | None:
    """`compare` over chunks of rows where rows are independent: the float64 copies then never
    exceed a chunk, however large the tensors."""
    if not rows_independent(spec):
        return compare(spec, dtype, inputs, outputs)
    m = inputs[0].shape[0]
    rows = max(1, chunk_elems // max(1, inputs[0][:1].numel()))

    def rows_of(t: torch.Tensor, desc_dims: tuple[str, ...], lo: int, hi: int) -> torch.Tensor:
        return t[lo:hi] if desc_dims and desc_dims[0] == "M" else t

    for lo in range(0, m, rows):
        hi = min(m, lo + rows)
        ins = [rows_of(t, d.dims, lo, hi) for t, d in zip(inputs, spec.inputs)]
        outs = [rows_of(t, d.dims, lo, hi) for t, d in zip(outputs, spec.outputs)]
        bad = compare(spec, dtype, ins, outs)
        if bad is not None:
            index = (bad.index[0] + lo, *bad.index[1:]) if bad.index else bad.index
            return replace(bad, output=f"{bad.output}[{lo}:{hi}]", index=index)  # counts are the chunk's
    return None
