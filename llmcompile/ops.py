"""Op specs: what an op computes, on which inputs, what it must move, and how close is right.

A spec is data. Its tensors are listed in kernel-contract order (inputs, then outputs) with
their dims written as symbols: "M" (rows, symbolic at compile time) and "N" (the reduced
length, fixed at compile time). Scalars follow, with defaults.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "f32": "float32", "half": "float16"}


class OpError(ValueError):
    """An unknown op, or a problem that the op cannot take (bad shape, dtype, file)."""


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
    dims: tuple[str, ...]  # "M", "N" or an int
    dtype: str | None = None  # None: the op's dtype
    output: bool = False

    def shape(self, m: int, n: int) -> tuple[int, ...]:
        return tuple(m if d == "M" else n if d == "N" else int(d) for d in self.dims)

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

# Benchmark grid of the foundation issue: 2^28 elements per input, N from 1k to 262k.
BENCH_N = (1024, 4096, 16384, 65536, 131072, 262144)
BENCH_ELEMS = 1 << 28
SMALL_M = 32768
SMALL_N = (256, 512, 1024, 2048)


def parse_shape(text: str) -> tuple[int, int]:
    """'32768x4096' -> (32768, 4096); OpError on anything else."""
    try:
        m, n = str(text).lower().split("x")
        return int(m), int(n)
    except ValueError:
        raise OpError(f"bad shape {text!r}: write MxN, e.g. 32768x4096") from None


def bench_shapes(elems: int = BENCH_ELEMS) -> list[tuple[int, int]]:
    return [(elems // n, n) for n in BENCH_N]


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


# --------------------------------------------------------------------------- input makers


def _logits(m: int, n: int, dtype: str, gen: torch.Generator, case: str, device: str) -> torch.Tensor:
    x = torch.randn(m, n, generator=gen, dtype=torch.float32, device=gen.device)
    if case == "large":
        x = x * 1000.0
    elif case == "neg_inf":
        # -inf scattered over ~10% of entries, and one whole row when there are several
        x = torch.where(torch.rand(m, n, generator=gen, device=gen.device) < 0.1, torch.tensor(float("-inf")), x)
        if m > 2:
            x[m // 2] = float("-inf")
    elif case == "shifted":
        x = x + 30.0  # exp overflows without the max subtraction
    return x.to(DTYPES[dtype]).to(device)


def _softmax_inputs(m, n, dtype, gen, case, device):
    return [_logits(m, n, dtype, gen, case, device)]


def _norm_inputs(with_bias: bool):
    def make(m, n, dtype, gen, case, device):
        x = torch.randn(m, n, generator=gen, device=gen.device)
        if case == "large":
            x = x * 1000.0
        elif case == "shifted":
            x = x + 100.0  # a large mean: exposes E[x^2] - E[x]^2 cancellation
        w = torch.rand(n, generator=gen, device=gen.device) + 0.5
        out = [x.to(DTYPES[dtype]).to(device), w.to(DTYPES[dtype]).to(device)]
        if with_bias:
            out.append(torch.randn(n, generator=gen, device=gen.device).to(DTYPES[dtype]).to(device))
        return out

    return make


IGNORE_CASE = 7  # the ignore_index of the cross-entropy ops' "ignore_7" case (scalar_cases)


def _ce_inputs(m, n, dtype, gen, case, device):
    x = _logits(m, n, dtype, gen, "large" if case == "large" else "random", device)
    target = torch.randint(0, n, (m,), generator=gen, dtype=torch.int64, device=gen.device)
    if case in ("ignore_index", "ignore_7"):
        ignored = -100 if case == "ignore_index" else IGNORE_CASE
        target = torch.where(torch.rand(m, generator=gen, device=gen.device) < 0.3, torch.tensor(ignored), target)
    return [x, target.to(device)]


# --------------------------------------------------------------------------- generic cases
# Inputs every problem is also verified on, made from its random ones. A bound fair to every
# honest order of a long reduction cannot see one skipped term among many small ones (verify.py);
# on these the same slip moves the answer far past it.
#   spikes:     1.5 x SPIKE added along every edge and across the middle of the first floating
#               input (its first and middle index in each dim: a tile or a split in halves that
#               drops a row), 2 x SPIKE along its last index (an off-by-one), and SPIKE of either
#               sign at one random element in SPIKE_EVERY: a term skipped at any of these costs
#               one 64x the rest, and one skipped at the end of a max is the max
#   dips:       the same, subtracted: the last index holds each min
#   integers:   every floating input small integers, a zero-sum cycle along every dim, so sums in
#               any order are exact in fp32 and a skipped term moves the result by at least 1
#   degenerate: rows of zeros and a constant row in the first floating input (a user's padding)
GENERIC_CASES = ("spikes", "dips", "integers", "degenerate")
SPIKE = 64.0
SPIKE_EVERY = 1024
CYCLE = (1.0, -1.0, 2.0, -2.0, 3.0, -3.0, 4.0, -4.0)


def generic_inputs(case: str, inputs: list[torch.Tensor], gen: torch.Generator) -> list[torch.Tensor] | None:
    """`inputs` (random ones) turned into a generic case's; None when the case says nothing here
    (no floating input; fewer than three rows for `degenerate`)."""
    first = next((i for i, x in enumerate(inputs) if x.is_floating_point()), None)
    if first is None:
        return None
    out = list(inputs)
    x = inputs[first]
    if case in ("spikes", "dips"):
        y = x.float().clone()
        sign = 1.0 if case == "spikes" else -1.0
        for d in range(y.dim()):
            for i in sorted({0, y.shape[d] // 2, y.shape[d] - 1}):
                y.select(d, i).add_(sign * SPIKE * (2.0 if i == y.shape[d] - 1 else 1.5))
        where = torch.rand(y.shape, generator=gen, device=gen.device).to(y.device) < 1.0 / SPIKE_EVERY
        signs = torch.where(torch.rand(y.shape, generator=gen, device=gen.device).to(y.device) < 0.5, -SPIKE, SPIKE)
        out[first] = torch.where(where, y + signs, y).to(x.dtype)
    elif case == "integers":
        for i, t in enumerate(inputs):
            if not t.is_floating_point():
                continue
            order = torch.randperm(len(CYCLE), generator=gen, device=gen.device).to(t.device)
            cycle = torch.tensor(CYCLE, device=t.device)[order]
            index = torch.zeros((), dtype=torch.int64, device=t.device)
            for size in t.shape:
                index = index.unsqueeze(-1) + torch.arange(size, device=t.device)  # the sum of each element's indices
            out[i] = cycle[index % len(CYCLE)].to(t.dtype).reshape(t.shape)
    elif case == "degenerate":
        if x.dim() < 1 or x.shape[0] < 3:
            return None
        y = x.clone()
        m = x.shape[0]
        y[0] = 0.0
        y[m // 3] = 0.0
        y[m // 2] = 3.0
        out[first] = y
    else:
        raise ValueError(f"unknown generic case {case!r}")
    return out


# --------------------------------------------------------------------------- references


def _ref_copy(x):
    return [x]


def _ref_softmax(x):
    return [torch.softmax(x, dim=-1)]


def _ref_log_softmax(x):
    return [torch.log_softmax(x, dim=-1)]


def _ref_rmsnorm(x, w, eps):
    return [x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w]


def _ref_layernorm(x, w, b, eps):
    return [F.layer_norm(x, (x.shape[-1],), w, b, eps)]


def _ref_cross_entropy(x, target, ignore_index):
    return [F.cross_entropy(x, target, ignore_index=ignore_index, reduction="none").float().double()]


# --------------------------------------------------------------------------- backward ops
# Their inputs come from the forward (its output y, its lse), made here from the forward's own
# torch op on the same logits, so the gradient is that of a real forward pass. The random draws
# come from the CPU generator (the same inputs on any device); what follows from them is computed
# on the target device (at the benchmark's 2^28 elements, a CPU softmax costs seconds a set).


def _softmax_bwd_inputs(log: bool):
    def make(m, n, dtype, gen, case, device):
        x = _logits(m, n, "float32", gen, "large" if case == "peaked" else "random", device)
        y = torch.log_softmax(x, -1) if log else torch.softmax(x, -1)
        del x
        dy = torch.randn(m, n, generator=gen, device=gen.device)
        if case == "large":
            dy = dy * 1000.0
        return [dy.to(DTYPES[dtype]).to(device), y.to(DTYPES[dtype])]

    return make


def _ce_bwd_inputs(m, n, dtype, gen, case, device):
    x, target = _ce_inputs(m, n, dtype, gen, case, device)
    dloss = torch.randn(m, generator=gen, device=gen.device)
    return [x, target, torch.logsumexp(x.float(), -1), dloss.to(device)]


def _ref_softmax_bwd(dy, y):
    return [y * (dy - (dy * y).sum(-1, keepdim=True))]


def _ref_log_softmax_bwd(dy, y):
    return [dy - torch.exp(y) * dy.sum(-1, keepdim=True)]


def _ref_cross_entropy_fwd(x, target, ignore_index):
    return [*_ref_cross_entropy(x, target, ignore_index), torch.logsumexp(x, -1)]


def _ref_cross_entropy_bwd(x, target, lse, dloss, ignore_index):
    # lse as the forward stored it (fp32): the gradient of the loss the forward reported
    p = torch.exp(x - lse[:, None])
    kept = target != ignore_index
    onehot = F.one_hot(torch.where(kept, target, 0), x.shape[-1]).to(p.dtype)
    return [(p - onehot) * torch.where(kept, dloss, 0.0)[:, None]]


def _t_softmax_bwd(dy, y):
    return torch.ops.aten._softmax_backward_data(dy, y, -1, y.dtype)


def _t_log_softmax_bwd(dy, y):
    return torch.ops.aten._log_softmax_backward_data(dy, y, -1, y.dtype)


def _t_cross_entropy_fwd(x, t, ignore_index):
    return [F.cross_entropy(x, t, ignore_index=ignore_index, reduction="none"), torch.logsumexp(x.float(), -1)]


def _t_cross_entropy_bwd(x, t, lse, dloss, ignore_index):
    kept = t != ignore_index
    p = torch.exp(x.float() - lse[:, None])
    p[torch.arange(x.shape[0], device=x.device), torch.where(kept, t, 0)] -= 1.0
    return (p * torch.where(kept, dloss, 0.0)[:, None]).to(x.dtype)


def _norm_bwd_inputs(with_bias: bool):
    forward = _norm_inputs(with_bias)

    def make(m, n, dtype, gen, case, device):
        x, w, *_ = forward(m, n, dtype, gen, case, device)
        dy = torch.randn(m, n, generator=gen, device=gen.device).to(DTYPES[dtype]).to(device)
        xf = x.float()  # the statistics as the forward kernels save them: fp32
        if with_bias:
            mean = xf.mean(-1)
            stats = [mean, torch.rsqrt((xf - mean[:, None]).pow(2).mean(-1) + 1e-5)]
        else:
            stats = [torch.rsqrt(xf.pow(2).mean(-1) + 1e-6)]
        del xf
        return [dy, x, w, *stats]

    return make


def _ref_rmsnorm_fwd(x, w, eps):
    rstd = torch.rsqrt(x.pow(2).mean(-1) + eps)
    return [x * rstd[:, None] * w, rstd]


def _ref_layernorm_fwd(x, w, b, eps):
    mean = x.mean(-1)
    rstd = torch.rsqrt((x - mean[:, None]).pow(2).mean(-1) + eps)
    return [(x - mean[:, None]) * rstd[:, None] * w + b, mean, rstd]


def _ref_rmsnorm_bwd(dy, x, w, rstd):
    xhat, g = x * rstd[:, None], dy * w
    return [(g - xhat * (g * xhat).mean(-1, keepdim=True)) * rstd[:, None], (dy * xhat).sum(0)]


def _ref_layernorm_bwd(dy, x, w, mean, rstd):
    xhat, g = (x - mean[:, None]) * rstd[:, None], dy * w
    dx = (g - xhat * (g * xhat).mean(-1, keepdim=True) - g.mean(-1, keepdim=True)) * rstd[:, None]
    return [dx, (dy * xhat).sum(0), dy.sum(0)]


# torch's own fused kernels, as a training step calls them (statistics shaped (M, 1) there);
# where a torch build has none for the device, the same in torch expressions
def _torch_fused(name: str, *args):  # noqa: ANN202
    op = getattr(torch.ops.aten, name, None)
    if op is not None and args[0].is_cuda:
        try:
            return op(*args)
        except (RuntimeError, NotImplementedError):
            pass
    return None


def _t_rmsnorm_fwd(x, w, eps):
    out = _torch_fused("_fused_rms_norm", x, [x.shape[-1]], w, eps)
    if out is not None:
        return out
    rstd = torch.rsqrt(x.float().pow(2).mean(-1) + eps)
    return [(x.float() * rstd[:, None] * w.float()).to(x.dtype), rstd]


def _t_rmsnorm_bwd(dy, x, w, rstd):
    out = _torch_fused("_fused_rms_norm_backward", dy, x, [x.shape[-1]], rstd[:, None], w, [True, True])
    if out is not None:
        return out
    return [t.to(x.dtype) for t in _ref_rmsnorm_bwd(dy.float(), x.float(), w.float(), rstd)]


def _t_layernorm_fwd(x, w, b, eps):
    return torch.ops.aten.native_layer_norm(x, [x.shape[-1]], w, b, eps)


def _t_layernorm_bwd(dy, x, w, mean, rstd):
    n = [x.shape[-1]]
    return torch.ops.aten.native_layer_norm_backward(dy, x, n, mean[:, None], rstd[:, None], w, w, [True] * 3)


def _ce_fused_inputs(m, n, dtype, gen, case, device):
    x, target = _ce_inputs(m, n, dtype, gen, case, device)
    kept = (target != -100).sum().clamp(min=1)
    return [x, target, (1.0 / kept.double()).float().reshape(1)]  # a mean's upstream gradient


def _ref_cross_entropy_fused(x, target, scale, ignore_index):
    lse = torch.logsumexp(x, -1)
    dx = _ref_cross_entropy_bwd(x, target, lse, scale.expand(x.shape[0]), ignore_index)[0]
    return [*_ref_cross_entropy(x, target, ignore_index), dx]


def _t_cross_entropy_fused(x, t, scale, ignore_index):
    lse = torch.logsumexp(x.float(), -1)
    return [
        _t_cross_entropy(x, t, ignore_index),
        _t_cross_entropy_bwd(x, t, lse, scale.expand(x.shape[0]), ignore_index),
    ]


def _softmax_bwd_spec(log: bool) -> OpSpec:
    name = "log_softmax_bwd" if log else "softmax_bwd"
    row = ("M", "N")
    return OpSpec(
        name,
        f"{name[:-4].replace('_', '-')} backward over the last dim, from the forward's output y",
        (TensorDesc("dy", row), TensorDesc("y", row), TensorDesc("dx", row, output=True)),
        _ref_log_softmax_bwd if log else _ref_softmax_bwd,
        _softmax_bwd_inputs(log),
        cases=("random", "peaked", "large"),
        reference_module=name,
        torch_expr=(
            "dx = dy - torch.exp(y) * dy.sum(-1, keepdim=True)"
            if log
            else "dx = y * (dy - (dy * y).sum(-1, keepdim=True))"
        ),
        torch_fn=_t_log_softmax_bwd if log else _t_softmax_bwd,
    )


def _t_rmsnorm(x, w, eps):
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def _t_layernorm(x, w, b, eps):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def _t_cross_entropy(x, t, ignore_index):
    return F.cross_entropy(x, t, ignore_index=ignore_index, reduction="none")


# eps large enough to move every output (rsqrt(1 + 0.5) against rsqrt(1)); the cross-entropy ops
# with 30% of their targets at IGNORE_CASE and that as ignore_index
EPS_CASES = (("random", {"eps": 0.5}),)
IGNORE_CASES = (("ignore_7", {"ignore_index": IGNORE_CASE}),)

_X = TensorDesc("x", ("M", "N"))
_OUT = TensorDesc("out", ("M", "N"), output=True)
_W = TensorDesc("weight", ("N",))
_DY = TensorDesc("dy", ("M", "N"))
_DX = TensorDesc("dx", ("M", "N"), output=True)


def _STAT(name: str, output: bool = True) -> TensorDesc:  # noqa: N802 - a descriptor maker beside _X, _OUT
    return TensorDesc(name, ("M",), "float32", output=output)


BUILTIN: dict[str, OpSpec] = {
    s.name: s
    for s in (
        OpSpec(
            "copy",
            "out = x: the memory speed-of-light probe",
            (_X, _OUT),
            _ref_copy,
            _softmax_inputs,
            tolerance={d: Tolerance(0.0, 0.0) for d in DTYPES},
            reference_module="copy",
            torch_expr="out = x.clone()",
            torch_fn=torch.clone,
        ),
        OpSpec(
            "softmax",
            "softmax over the last dim",
            (_X, _OUT),
            _ref_softmax,
            _softmax_inputs,
            cases=("random", "large", "neg_inf", "shifted"),
            reference_module="softmax",
            torch_expr="out = torch.softmax(x, dim=-1)",
            torch_fn=lambda x: torch.softmax(x, dim=-1),
        ),
        OpSpec(
            "log_softmax",
            "log-softmax over the last dim",
            (_X, _OUT),
            _ref_log_softmax,
            _softmax_inputs,
            cases=("random", "large", "neg_inf", "shifted"),
            reference_module="log_softmax",
            torch_expr="out = torch.log_softmax(x, dim=-1)",
            torch_fn=lambda x: torch.log_softmax(x, dim=-1),
        ),
        OpSpec(
            "rmsnorm",
            "RMSNorm over the last dim, with weight",
            (_X, TensorDesc("weight", ("N",)), _OUT),
            _ref_rmsnorm,
            _norm_inputs(False),
            scalars={"eps": 1e-6},
            scalar_cases=EPS_CASES,
            cases=("random", "large", "shifted"),
            reference_module="rmsnorm",
            torch_expr="out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight",
            torch_fn=_t_rmsnorm,
        ),
        OpSpec(
            "layernorm",
            "LayerNorm over the last dim, with weight and bias",
            (_X, TensorDesc("weight", ("N",)), TensorDesc("bias", ("N",)), _OUT),
            _ref_layernorm,
            _norm_inputs(True),
            scalars={"eps": 1e-5},
            scalar_cases=EPS_CASES,
            cases=("random", "large", "shifted"),
            # fp32 x - mean at |mean| = 100 rounds at 1e-5 whatever the kernel does
            tolerance={**DEFAULT_TOL, "float32": Tolerance(1e-4, 1e-4)},
            reference_module="layernorm",
            torch_expr="out = F.layer_norm(x, (N,), weight, bias, eps)",
            torch_fn=_t_layernorm,
        ),
        OpSpec(
            "cross_entropy",
            "per-row cross-entropy loss (fp32) from logits and int64 targets",
            (_X, TensorDesc("target", ("M",), "int64"), TensorDesc("loss", ("M",), "float32", output=True)),
            _ref_cross_entropy,
            _ce_inputs,
            scalars={"ignore_index": -100},
            scalar_cases=IGNORE_CASES,
            cases=("random", "large", "ignore_index"),
            # the loss is fp32 whatever the logits are: only the kernel's own arithmetic errs
            tolerance={d: Tolerance(1e-4, 1e-4) for d in DTYPES},
            reference_module="cross_entropy",
            torch_expr="loss = F.cross_entropy(x, target, ignore_index=ignore_index, reduction='none')",
            torch_fn=_t_cross_entropy,
        ),
        OpSpec(
            "cross_entropy_fwd",
            "per-row cross-entropy loss and log-sum-exp (fp32), the forward a training step runs",
            (
                _X,
                TensorDesc("target", ("M",), "int64"),
                TensorDesc("loss", ("M",), "float32", output=True),
                TensorDesc("lse", ("M",), "float32", output=True),
            ),
            _ref_cross_entropy_fwd,
            _ce_inputs,
            scalars={"ignore_index": -100},
            scalar_cases=IGNORE_CASES,
            cases=("random", "large", "ignore_index"),
            tolerance={d: Tolerance(1e-4, 1e-4) for d in DTYPES},
            reference_module="cross_entropy_fwd",
            torch_expr=(
                "loss = F.cross_entropy(x, target, ignore_index=ignore_index, reduction='none'); "
                "lse = torch.logsumexp(x.float(), -1)"
            ),
            torch_fn=_t_cross_entropy_fwd,
        ),
        _softmax_bwd_spec(log=False),
        _softmax_bwd_spec(log=True),
        OpSpec(
            "cross_entropy_bwd",
            "cross-entropy backward per row: dlogits from the logits, targets, the forward's lse and dloss",
            (
                _X,
                TensorDesc("target", ("M",), "int64"),
                TensorDesc("lse", ("M",), "float32"),
                TensorDesc("dloss", ("M",), "float32"),
                TensorDesc("dx", ("M", "N"), output=True),
            ),
            _ref_cross_entropy_bwd,
            _ce_bwd_inputs,
            scalars={"ignore_index": -100},
            scalar_cases=IGNORE_CASES,
            cases=("random", "large", "ignore_index"),
            reference_module="cross_entropy_bwd",
            torch_expr=(
                "dx = ((torch.exp(x.float() - lse[:, None]) - F.one_hot(target, N)) * dloss[:, None]).to(x.dtype), "
                "0 in rows where target == ignore_index"
            ),
            torch_fn=_t_cross_entropy_bwd,
        ),
        OpSpec(
            "rmsnorm_fwd",
            "RMSNorm over the last dim for training: the output and each row's rstd (fp32)",
            (_X, _W, _OUT, _STAT("rstd")),
            _ref_rmsnorm_fwd,
            _norm_inputs(False),
            scalars={"eps": 1e-6},
            scalar_cases=EPS_CASES,
            cases=("random", "large", "shifted"),
            reference_module="rmsnorm_fwd",
            torch_expr="rstd = torch.rsqrt(x.float().pow(2).mean(-1) + eps); out = x * rstd[:, None] * weight",
            torch_fn=_t_rmsnorm_fwd,
        ),
        OpSpec(
            "layernorm_fwd",
            "LayerNorm over the last dim for training: the output and each row's mean and rstd (fp32)",
            (_X, _W, TensorDesc("bias", ("N",)), _OUT, _STAT("mean"), _STAT("rstd")),
            _ref_layernorm_fwd,
            _norm_inputs(True),
            scalars={"eps": 1e-5},
            scalar_cases=EPS_CASES,
            cases=("random", "large", "shifted"),
            tolerance={**DEFAULT_TOL, "float32": Tolerance(1e-4, 1e-4)},
            reference_module="layernorm_fwd",
            torch_expr=(
                "mean = x.float().mean(-1); rstd = torch.rsqrt(x.float().var(-1, unbiased=False) + eps); "
                "out = F.layer_norm(x, (N,), weight, bias, eps)"
            ),
            torch_fn=_t_layernorm_fwd,
        ),
        OpSpec(
            "rmsnorm_bwd",
            "RMSNorm backward over the last dim: dx, and dw summed over rows, from the forward's rstd",
            (_DY, _X, _W, _STAT("rstd", output=False), _DX, TensorDesc("dw", ("N",), output=True)),
            _ref_rmsnorm_bwd,
            _norm_bwd_inputs(False),
            cases=("random", "large", "shifted"),
            reference_module="rmsnorm_bwd",
            torch_expr=(
                "xhat = x * rstd[:, None]; g = dy * weight; "
                "dx = (g - xhat * (g * xhat).mean(-1, keepdim=True)) * rstd[:, None]; dw = (dy * xhat).sum(0)"
            ),
            torch_fn=_t_rmsnorm_bwd,
            independent_rows=False,
        ),
        OpSpec(
            "layernorm_bwd",
            "LayerNorm backward over the last dim: dx, and dw, db summed over rows, from the forward's mean and rstd",
            (
                _DY,
                _X,
                _W,
                _STAT("mean", output=False),
                _STAT("rstd", output=False),
                _DX,
                TensorDesc("dw", ("N",), output=True),
                TensorDesc("db", ("N",), output=True),
            ),
            _ref_layernorm_bwd,
            _norm_bwd_inputs(True),
            cases=("random", "large", "shifted"),
            tolerance={**DEFAULT_TOL, "float32": Tolerance(1e-4, 1e-4)},
            reference_module="layernorm_bwd",
            torch_expr=(
                "xhat = (x - mean[:, None]) * rstd[:, None]; g = dy * weight; dx = (g - xhat * (g * xhat).mean(-1, "
                "keepdim=True) - g.mean(-1, keepdim=True)) * rstd[:, None]; dw = (dy * xhat).sum(0); db = dy.sum(0)"
            ),
            torch_fn=_t_layernorm_bwd,
            independent_rows=False,
        ),
        OpSpec(
            "cross_entropy_fused",
            "cross-entropy forward and backward in one pass: each row's loss (fp32) and dlogits for an upstream scale",
            (
                _X,
                TensorDesc("target", ("M",), "int64"),
                TensorDesc("scale", ("1",), "float32"),
                TensorDesc("loss", ("M",), "float32", output=True),
                _DX,
            ),
            _ref_cross_entropy_fused,
            _ce_fused_inputs,
            scalars={"ignore_index": -100},
            scalar_cases=IGNORE_CASES,
            cases=("random", "large", "ignore_index"),
            reference_module="cross_entropy_fused",
            torch_expr=(
                "loss = F.cross_entropy(x, target, ignore_index=ignore_index, reduction='none'); "
                "dx = ((torch.softmax(x.float(), -1) - F.one_hot(target, N)) * scale[0]).to(x.dtype), "
                "0 in rows where target == ignore_index"
            ),
            torch_fn=_t_cross_entropy_fused,
        ),
    )
}


# --------------------------------------------------------------------------- attention
# Rows are (batch x head) pairs: q, k, v and o are (M, N, D) with N the sequence length and D
# the head dim (fixed per spec), lse (M, N) fp32. Heads are independent, so M chunks like rows.
ATTN_TOKENS = 1 << 18  # M * N across the grid: 16 heads x 16K tokens at the longest
ATTN_SEQLENS = (1024, 2048, 4096, 8192, 16384)
ATTN_HELD_OUT = ((3, 1000), (2, 5001), (5, 129))  # partial last tiles of queries and keys
ATTN_REF_ELEMS = 1 << 26  # float64 scores a reference step holds (512 MiB)


def attention_flops(d: int, causal: bool) -> Callable[[int, int], float]:
    """Two GEMMs (QK^T, PV) of 2*N*N*D each a head; causal does half (the convention the FA
    papers and cuDNN report in, so TFLOP/s compare)."""

    def flops(m: int, n: int) -> float:
        return 4.0 * m * n * n * d / (2 if causal else 1)

    return flops


def _ref_attention(causal: bool):
    def ref(q, k, v, scale):
        m, n, _ = q.shape
        o = torch.empty_like(q)
        lse = torch.empty(m, n, dtype=q.dtype, device=q.device)
        step = max(1, ATTN_REF_ELEMS // max(1, m * n))
        cols = torch.arange(n, device=q.device)
        for i in range(0, n, step):
            s = torch.einsum("bqd,bkd->bqk", q[:, i : i + step], k) * scale
            if causal:
                rows = torch.arange(i, min(n, i + step), device=q.device)
                s.masked_fill_(cols[None, None, :] > rows[None, :, None], float("-inf"))
            lse_i = torch.logsumexp(s, -1)
            o[:, i : i + step] = torch.einsum("bqk,bkd->bqd", torch.exp(s - lse_i[..., None]), v)
            lse[:, i : i + step] = lse_i
            del s
        return [o, lse]

    return ref


def _attention_inputs(d: int):
    def make(m, n, dtype, gen, case, device):
        q, k, v = (torch.randn(m, n, d, generator=gen, device=gen.device) for _ in range(3))
        if case == "large":
            q = q * 16.0  # logits ~ N(0, 16^2): each row's softmax all but one-hot
        return [t.to(DTYPES[dtype]).to(device) for t in (q, k, v)]

    return make


def _t_attention(causal: bool):
    def fn(q, k, v, scale):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)

    return fn


def _attention_spec(d: int, causal: bool) -> OpSpec:
    name = "attention" + ("_causal" if causal else "") + ("" if d == 128 else f"_d{d}")
    head = ("M", "N", str(d))
    return OpSpec(
        name,
        f"{'causal ' if causal else ''}softmax attention forward, head dim {d}: o and each query's log-sum-exp",
        (
            TensorDesc("q", head),
            TensorDesc("k", head),
            TensorDesc("v", head),
            TensorDesc("o", head, output=True),
            TensorDesc("lse", ("M", "N"), "float32", output=True),
        ),
        _ref_attention(causal),
        _attention_inputs(d),
        scalars={"scale": 1.0 / d**0.5},
        cases=("random", "large"),
        # P is rounded to the input dtype before the second GEMM (as every flash kernel does)
        tolerance={"bfloat16": Tolerance(2e-2, 2e-2), "float16": Tolerance(4e-3, 4e-3)},
        dtypes=("bfloat16", "float16"),
        reference_module="attention" + ("_causal" if causal else ""),
        torch_expr=(
            f"o = F.scaled_dot_product_attention(q, k, v, is_causal={causal}, scale=scale); "
            f"lse = torch.logsumexp((q.float() @ k.float().transpose(1, 2)) * scale{' (causal mask)' if causal else ''}, -1)"
        ),
        torch_fn=_t_attention(causal),
        fixed_shapes=tuple((ATTN_TOKENS // n, n) for n in ATTN_SEQLENS),
        flops=attention_flops(d, causal),
        extra_verify=ATTN_HELD_OUT,
        reference_scratch=3 * 8 * ATTN_REF_ELEMS,  # the scores, their exp, the mask
    )


BUILTIN.update({s.name: s for s in (_attention_spec(d, c) for d in (128, 64) for c in (False, True))})


def get_op(name: str) -> OpSpec:
    """A built-in op by name, or a custom op from a KernelBench-format file (a path ending .py)."""
    if name.endswith(".py") or "/" in name:
        from llmcompile.kernelbench import load_problem

        return load_problem(name)
    try:
        return BUILTIN[name]
    except KeyError:
        raise OpError(
            f"unknown op {name!r}; known ops: {', '.join(sorted(BUILTIN))}, or a KernelBench-format .py file"
        ) from None


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
