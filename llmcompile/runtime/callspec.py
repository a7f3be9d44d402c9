"""What calling a compiled kernel needs to know of its op (`CallSpec`), kept apart from the call
itself so that an artifact's manifest, the judge and the exporter read it without the call path."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmcompile.specs import HasTensors, OpSpec, TensorDesc


@dataclass(frozen=True)
class CallSpec(HasTensors):
    """What calling a kernel needs to know of its op: its tensors (inputs, then outputs), its
    scalars with their defaults, and the dtypes it takes. Built from an OpSpec, or from an
    artifact's manifest where no OpSpec exists (a loader without the problem's file)."""

    name: str
    tensors: tuple[TensorDesc, ...]
    scalars: dict[str, float | int]
    dtypes: tuple[str, ...]

    @classmethod
    def of(cls, spec: OpSpec) -> CallSpec:
        return cls(spec.name, spec.tensors, dict(spec.scalars), tuple(spec.dtypes))

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "tensors": [[t.name, list(t.dims), t.dtype, t.output] for t in self.tensors],
            "scalars": self.scalars,
            "dtypes": list(self.dtypes),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CallSpec:
        tensors = tuple(TensorDesc(name, tuple(dims), dt, bool(out)) for name, dims, dt, out in d["tensors"])
        return cls(d["name"], tensors, dict(d["scalars"]), tuple(d["dtypes"]))


def schema(spec: CallSpec) -> str:
    parts = [f"Tensor {t.name}" for t in spec.inputs]
    parts += [f"Tensor(a{i}!) {t.name}" for i, t in enumerate(spec.outputs)]
    parts += [f"{'int' if isinstance(v, int) else 'float'} {k}" for k, v in spec.scalars.items()]
    return f"({', '.join(parts)}) -> ()"
