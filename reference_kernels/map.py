"""The elementwise template: outputs computed element by element from N inputs.

    out_j[e] = body(in_0[e], ..., in_k[e], scalars)_j        for every element e

Operands are flat: every "full" input and every output is the output's shape, read and
written as one contiguous run of elements. A CTA owns a tile of `num_threads * unroll`
vectors; each thread issues all its loads (128-bit where the shape allows) before it
computes, so `unroll` vectors per input are in flight per thread. Offsets are 64-bit, so a
tensor may hold more than 2^31 elements (KernelBench's largest hold 2^32).

Broadcast operands: a "row" input holds one value per leading index (shape (M,) or
(M, 1, ...)), e.g. the diagonal of diag(a) @ B; a "one" input holds one value (shape (1,)), read
on the device (an upstream gradient: no host sync); scalars arrive as Float32 / Int64 values.
The body sees fp32 `TensorSSA` vectors for full inputs and fp32 scalars for the rest, and
returns a tuple of fp32 vectors, one per output (converted to each output's dtype).

The body is any function of CuTe DSL math (`cute.math.*`, `cute.where`, arithmetic), so
activations, scalings and fused chains of them are one template.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, const_expr

from reference_kernels.reduce import vector_at as _vector_at
from reference_kernels.reduce import vector_elems

KINDS = ("full", "row", "one")


@dataclass(frozen=True)
class MapKnobs:
    num_threads: int = 256
    unroll: int = 4  # vectors per thread per input in flight at once
    vec_bits: int = 128  # widest vector a thread moves at once


@dataclass(frozen=True)
class MapTiling:
    vec: int
    num_threads: int
    unroll: int
    inner: int  # elements per leading index (the product of the non-leading dims)

    @property
    def tile(self) -> int:
        return self.vec * self.num_threads * self.unroll


def resolve_tiling(knobs: MapKnobs, widest_bits: int, inner: int) -> MapTiling:
    """Vectors as wide as the knobs allow while every leading index's run of `inner` elements
    starts aligned to them, so a vector never straddles two leading indices (a row operand's
    value is read once per vector)."""
    if knobs.num_threads % 32 or not 32 <= knobs.num_threads <= 1024:
        raise ValueError(f"num_threads={knobs.num_threads} must be a multiple of 32, <= 1024")
    if not 1 <= knobs.unroll <= 16:
        raise ValueError(f"unroll={knobs.unroll} must be 1..16")
    vec = vector_elems(knobs.vec_bits, widest_bits, inner)
    return MapTiling(vec, knobs.num_threads, knobs.unroll, inner)


def _inner(t: cute.Tensor) -> int:
    return math.prod(t.shape[1:]) if cute.rank(t) > 1 else 1


class Map:
    """`body(values, scalars) -> outputs` over every element; `kinds[i]` says how input i is
    broadcast ("full" or "row")."""

    def __init__(self, body: Callable, kinds: tuple[str, ...], knobs: MapKnobs = MapKnobs()) -> None:
        if any(k not in KINDS for k in kinds):
            raise ValueError(f"input kinds must be among {KINDS}, got {kinds}")
        self.body, self.kinds, self.knobs = body, kinds, knobs
        # launched as a programmatic dependent, waiting for the grid before it (set at trace time
        # by a caller whose row kernels launch so: reference_kernels/scale.py)
        self.dependent = False

    @cute.jit
    def __call__(self, ins: tuple, outs: tuple, scalars: tuple, stream):
        ref = outs[0]
        for t in (*ins, *outs):  # (a caller then copies such rows dense: callpath.compiled_strided)
            if const_expr(cute.rank(t) > 1 and not cute.is_static(t.stride[0])):
                raise ValueError("the map template reads its operands flat, not rows at a run-time stride")
        inner = const_expr(_inner(ref))
        widest = const_expr(max(t.element_type.width for t in (*ins, *outs)))
        self.tiling = resolve_tiling(self.knobs, widest, inner)
        total = Int64(ref.shape[0]) * inner if const_expr(cute.rank(ref) > 0) else Int64(1)
        grid = Int32((total + self.tiling.tile - 1) // self.tiling.tile)
        self.kernel(ins, outs, scalars, total).launch(
            grid=[grid, 1, 1], block=[self.tiling.num_threads, 1, 1], stream=stream, use_pdl=self.dependent
        )

    @cute.kernel
    def kernel(self, ins: tuple, outs: tuple, scalars: tuple, total: Int64):
        t = self.tiling
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        start = Int64(bidx) * t.tile
        if const_expr(self.dependent):
            cute.arch.griddepcontrol_wait()
        # Every load of every unrolled vector first, so they are all in flight together.
        loaded = []
        for u in cutlass.range_constexpr(t.unroll):
            e = cute.assume(start + (u * t.num_threads + tidx) * t.vec, divby=t.vec)
            ok = e < total
            vals = []
            for i in cutlass.range_constexpr(len(self.kinds)):
                if const_expr(self.kinds[i] == "full"):
                    r = cute.make_rmem_tensor(t.vec, ins[i].element_type)
                    if ok:
                        cute.autovec_copy(_vector_at(ins[i], e, t.vec), r)
                    vals.append(r)
                else:
                    r = cute.make_rmem_tensor(1, ins[i].element_type)
                    r[0] = ins[i].element_type(0)
                    if ok:
                        at = Int64(0) if const_expr(self.kinds[i] == "one") else e // t.inner
                        r[0] = _vector_at(ins[i], at, 1)[0]
                    vals.append(r)
            loaded.append((e, ok, vals))
        for e, ok, vals in loaded:
            xs = tuple(
                v.load().to(Float32) if const_expr(self.kinds[i] == "full") else Float32(v[0])
                for i, v in enumerate(vals)
            )
            res = self.body(xs, scalars)
            for j in cutlass.range_constexpr(len(outs)):
                r = cute.make_rmem_tensor(t.vec, outs[j].element_type)
                r.store(res[j].to(outs[j].element_type))
                if ok:
                    cute.autovec_copy(r, _vector_at(outs[j], e, t.vec))


# --------------------------------------------------------------------------- vocabulary
# torch's elementwise functions on fp32 vectors, with torch's formulas (and its defaults),
# so that a body reads like the torch program it implements.


def zeros_like(x):
    return cute.full_like(x, 0.0)


def relu(x):
    return cute.where(x > 0.0, x, zeros_like(x))


def leaky_relu(x, negative_slope: float = 0.01):
    return cute.where(x > 0.0, x, x * negative_slope)


def sigmoid(x):
    return 1.0 / (1.0 + cute.math.exp(-x))


def silu(x):
    return x * sigmoid(x)


def tanh(x):
    return cute.math.tanh(x)


def gelu(x, approximate: str = "none"):
    if approximate == "tanh":
        return 0.5 * x * (1.0 + cute.math.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))
    return 0.5 * x * (1.0 + cute.math.erf(x * (1.0 / math.sqrt(2.0))))


def elu(x, alpha: float = 1.0):
    return cute.where(x > 0.0, x, alpha * cute.math.expm1(x))


SELU_ALPHA = 1.6732632423543772
SELU_SCALE = 1.0507009873554805


def selu(x):
    return SELU_SCALE * elu(x, SELU_ALPHA)


def softplus(x, beta: float = 1.0, threshold: float = 20.0):
    return cute.where(x * beta > threshold, x, cute.math.log1p(cute.math.exp(x * beta)) * (1.0 / beta))


def softsign(x):
    return x / (1.0 + cute.math.abs(x))


def hardtanh(x, min_val: float = -1.0, max_val: float = 1.0):
    return cute.where(x < min_val, cute.full_like(x, min_val), cute.where(x > max_val, cute.full_like(x, max_val), x))


def hardsigmoid(x):
    return hardtanh(x * (1.0 / 6.0) + 0.5, 0.0, 1.0)


def abs(x):  # noqa: A001 - torch's name
    return cute.math.abs(x)


def exp(x):
    return cute.math.exp(x)


def log(x):
    return cute.math.log(x)


def sqrt(x):
    return cute.math.sqrt(x)


def power(x, p: float):
    """x ** p; small integer powers as products (exact, like torch's)."""
    if float(p).is_integer() and 1 <= p <= 4:
        out = x
        for _ in range(int(p) - 1):
            out = out * x
        return out
    return cute.math.pow(x, cute.full_like(x, p))
