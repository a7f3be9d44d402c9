"""Op specs: what an op computes, on which inputs, what it must move, and how close is right.

A spec is data. Its tensors are listed in kernel-contract order (inputs, then outputs) with
their dims written as symbols: "M" (rows, symbolic at compile time), "M*k" (k rows an item
of M: an output of a batch's items flattened to rows) and "N" (the reduced length, fixed at
compile time). Scalars follow, with defaults.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from llmcompile.specs.contract import dim_size
from llmcompile.specs.errors import OpError
from llmcompile.specs.grids import bench_shapes

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "f32": "float32", "half": "float16"}


def dtype_name(d: str | torch.dtype) -> str:
    if isinstance(d, torch.dtype):
        for k, v in DTYPES.items():
            if v == d:
                return k
        raise OpError(f"dtype {d} is not supported; use one of {', '.join(DTYPES)}")
    name = DTYPE_ALIASES.get(d, d)
    if name not in DTYPES:
        raise OpError(f"dtype {d!r} is not supported; use one of {', '.join(DTYPES)}")
    return name


@dataclass(frozen=True)
class TensorDesc:
    name: str
    dims: tuple[str, ...]  # "M", "M*k", "N" or an int
    dtype: str | None = None  # None: the op's dtype
    output: bool = False

    def shape(self, m: int, n: int) -> tuple[int, ...]:
        return tuple(dim_size(d, m, n) for d in self.dims)

    def torch_dtype(self, op_dtype: str) -> torch.dtype:
        return {"int64": torch.int64, "int32": torch.int32, "bool": torch.bool, **DTYPES}[self.dtype or op_dtype]


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float


# Output rounding dominates: bf16 keeps 8 bits of mantissa, fp16 11, and the fp32 kernels
# use approximate exp2/rcp/rsqrt (a few ulp).
DEFAULT_TOL = {
    "float32": Tolerance(1e-5, 1e-4),
    "float16": Tolerance(1e-3, 4e-3),
    "bfloat16": Tolerance(8e-3, 2e-2),
}


InputMaker = Callable[[int, int, str, torch.Generator, str, str], list[torch.Tensor]]


MAX_ELEMS = 1 << 31  # the kernels index with 32 bits


class HasTensors:
    """What an op's tensors say about calling it: shared by `OpSpec` and `callpath.CallSpec`
    (the call of a loaded artifact, which has no OpSpec)."""

    name: str
    tensors: tuple[TensorDesc, ...]
    dtypes: tuple[str, ...]

    @property
    def flat_rows(self) -> bool:
        """True when the op's first tensor is (M, N) rows and leading dims flatten into M."""
        return self.tensors[0].dims == ("M", "N")

    @property
    def inputs(self) -> tuple[TensorDesc, ...]:
        return tuple(t for t in self.tensors if not t.output)

    @property
    def outputs(self) -> tuple[TensorDesc, ...]:
        return tuple(t for t in self.tensors if t.output)

    def alloc_outputs(self, m: int, n: int, dtype: str, device: str) -> list[torch.Tensor]:
        return [torch.empty(t.shape(m, n), dtype=t.torch_dtype(dtype), device=device) for t in self.outputs]

    def check_problem(self, m: int, n: int, dtype: str) -> None:
        if dtype not in self.dtypes:
            raise OpError(f"{self.name} does not take {dtype}; it takes {', '.join(self.dtypes)}")
        if m < 1 or n < 1:
            raise OpError(f"{self.name}: M and N must be >= 1, got M={m} N={n}")
        if m * n >= MAX_ELEMS:
            raise OpError(f"{self.name}: M*N={m * n} is >= 2^31 elements, past the kernels' 32-bit indexing")


@dataclass(frozen=True)
class OpSpec(HasTensors):
    name: str
    summary: str
    tensors: tuple[TensorDesc, ...]
    reference: Callable[..., list[torch.Tensor]]  # (inputs as float64 or int, **scalars) -> outputs
    make_inputs: InputMaker  # (m, n, dtype, generator, case, device) -> inputs
    scalars: dict[str, float | int] = field(default_factory=dict)
    cases: tuple[str, ...] = ("random",)  # value distributions verification draws from
    tolerance: dict[str, Tolerance] = field(default_factory=lambda: dict(DEFAULT_TOL))
    dtypes: tuple[str, ...] = ("float32", "bfloat16", "float16")
    reference_module: str | None = None  # reference_kernels.<module> implementing it
    torch_expr: str = ""  # what the op is in torch, as shown to an LLM
    # The op in plain torch on the caller's dtypes (inputs in spec order, then scalars):
    # the eager and torch.compile baselines.
    torch_fn: Callable[..., object] | None = None
    # Problems with fixed shapes (KernelBench files): the benchmark shapes; None: bench_shapes()
    fixed_shapes: tuple[tuple[int, int], ...] | None = None
    source_path: str | None = None  # the file a custom op came from
    batchable: bool = True  # means the same at any M (else checked at its own size only)
    # each output row depends on its own input rows only (not a norm over the whole batch)
    independent_rows: bool = True
    # Compute-bound ops: the floating-point operations the op must do at (M, N). With it the
    # judge and bench rate the op in TFLOP/s against the GPU's dense GEMM throughput measured
    # in the same process, not in TB/s against its copy bandwidth.
    flops: Callable[[int, int], float] | None = None
    # shapes verified beside the benchmark's (a fixed-shape op's held-out sizes)
    extra_verify: tuple[tuple[int, int], ...] = ()
    # GPU bytes the float64 reference holds beyond its inputs and outputs (attention's scores)
    reference_scratch: int = 0
    # every honest order of it is exact on small integers: "sum" (sums, maxima, cumsums, products
    # of them: one output rounding allowed on the verify stage's "integers" case) or "divided"
    # (the same ended by a division or square root: a mean, a norm); "" for none
    exact: str = ""
    # scalar values the verify stage also calls with, each on inputs of the named case: a kernel
    # that hard-codes eps or ignore_index is wrong for every caller who passes another
    scalar_cases: tuple[tuple[str, dict[str, float | int]], ...] = ()

    @property
    def ref(self) -> str:
        """How a worker process finds this spec again: a built-in name or a file path."""
        return self.source_path or self.name

    def shapes(self) -> list[tuple[int, int]]:
        return list(self.fixed_shapes) if self.fixed_shapes else bench_shapes()

    def run_reference(self, inputs: list[torch.Tensor], **scalars: float | int) -> list[torch.Tensor]:
        up = [x.double() if x.is_floating_point() else x for x in inputs]
        return self.reference(*up, **{**self.scalars, **scalars})

    def bytes_moved(self, m: int, n: int, dtype: str) -> int:
        """Each input read once and each output written once: the floor on memory traffic."""
        return sum(
            torch.Size(t.shape(m, n)).numel() * torch.empty((), dtype=t.torch_dtype(dtype)).element_size()
            for t in self.tensors
        )

    def tol(self, dtype: str) -> Tolerance:
        return self.tolerance[dtype]

    @property
    def compute_bound(self) -> bool:
        return self.flops is not None

    @property
    def causal(self) -> bool:
        """A causal attention op (its reference module is the `_causal` one)."""
        return (self.reference_module or "").endswith("_causal")

    @property
    def unit(self) -> str:
        """What the op's rate is counted in: TFLOP/s (compute-bound) or TB/s."""
        return "TFLOP/s" if self.compute_bound else "TB/s"

    def work(self, m: int, n: int, dtype: str) -> float:
        """What a rate divides: FLOPs for a compute-bound op, else the minimum bytes moved."""
        return self.flops(m, n) if self.flops is not None else self.bytes_moved(m, n, dtype)
