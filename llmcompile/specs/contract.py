"""The kernel contract: the one shape of kernel module that the harness ever runs.

Reference kernels, the offline search's variants and LLM-written candidates all follow it:

1. The module is CuTe DSL only: it imports cutlass / cutlass.cute (and cuda bindings,
   math, functools, operator, typing, dataclasses) and may import the reduction template
   `reference_kernels.reduce`. It never imports torch or touches files, processes or sockets.
2. It defines `launch`: a `@cute.jit` function, or an object whose `__call__` is `@cute.jit`.
3. `launch` takes the op's tensors as `cute.Tensor`, inputs first then outputs (in the order
   of the op spec; the caller allocates the outputs), then the op's scalars (floats arrive
   as `cutlass.Float32`, ints as `cutlass.Int64`), then the CUDA stream.
4. Tensors are row-major and contiguous. N (the reduced length) is a compile-time constant
   (`mX.shape[1]` is a Python int at trace time); M is symbolic, so one compiled kernel
   serves every M >= 1. Every tensor's base address is 16-byte aligned.
5. The kernel must write every output element, read inputs only, keep no state between
   calls, and be right for every M, including M = 1 and odd M.
6. A kernel that needs scratch in global memory (partials of a reduction across CTAs) says how
   much: a module-level `WORKSPACE = <fp32 elements>` (at most MAX_WORKSPACE). The caller then
   passes one more tensor, fp32 of that many elements, right after the outputs; its contents on
   entry are undefined, and it belongs to the call (launches on the call's stream only).

`compile_entry` turns such an entry into a callable on torch tensors for one (op, dtype, N).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llmcompile.specs import OpSpec


ENTRY = "launch"
DEFAULT_ARCH = "sm_90a"
WORKSPACE = "WORKSPACE"
MAX_WORKSPACE = 1 << 23  # fp32 elements (32 MiB: partial rows of a long row's column sums)


def ensure_arch(arch: str = DEFAULT_ARCH) -> None:
    """CuTe DSL needs an architecture to compile without a GPU; a GPU's own is used if present."""
    os.environ.setdefault("CUTE_DSL_ARCH", arch)


def cute_type(dtype_name: str):
    import cutlass

    return {
        "float32": cutlass.Float32,
        "bfloat16": cutlass.BFloat16,
        "float16": cutlass.Float16,
        "int64": cutlass.Int64,
        "int32": cutlass.Int32,
        "bool": cutlass.Boolean,
    }[dtype_name]


def scalar_value(v: float | int):
    import cutlass

    return cutlass.Int64(v) if isinstance(v, int) else cutlass.Float32(v)


def dim_size(d: str, m: Any, n: int) -> Any:
    """A dim's size at M = m (a number, or CuTe DSL's symbol), N = n: "M", "M*k" (k rows an item
    of M), "N" or a number."""
    if d.startswith("M*"):
        return m * int(d[2:])
    return m if d == "M" else n if d == "N" else int(d)


@dataclass(frozen=True)
class TensorSig:
    dims: tuple[str, ...]
    dtype: str | None = None


@dataclass(frozen=True)
class Signature:
    """What compiling an entry needs to know of its op (what `fake_args` reads of an OpSpec), as
    plain data: the sandboxed compile step gets this, never the problem's own Python."""

    tensors: tuple[TensorSig, ...]
    scalars: dict[str, float | int]

    @classmethod
    def of(cls, spec: OpSpec) -> Signature:
        return cls(tuple(TensorSig(tuple(map(str, t.dims)), t.dtype) for t in spec.tensors), dict(spec.scalars))

    def to_json(self) -> dict[str, Any]:
        return {"tensors": [[list(t.dims), t.dtype] for t in self.tensors], "scalars": self.scalars}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Signature:
        return cls(tuple(TensorSig(tuple(dims), dt) for dims, dt in d["tensors"]), dict(d["scalars"]))


def check_workspace(value: Any) -> int:
    """A module's WORKSPACE (or a manifest's), validated: an int in 0..MAX_WORKSPACE."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_WORKSPACE:
        raise ValueError(f"{WORKSPACE} must be an int of fp32 elements in 0..{MAX_WORKSPACE}, got {value!r}")
    return value


def workspace_of(module: ModuleType) -> int:
    return check_workspace(getattr(module, WORKSPACE, 0))


def fake_args(
    spec: OpSpec | Signature,
    dtype: str,
    n: int,
    workspace: int = 0,
    strided_rows: bool = False,
    strided_v: bool = False,
) -> list[Any]:
    """Compile-time stand-ins for the entry's arguments: tensors with M symbolic, N fixed.
    `strided_rows`: the first tensor's rows (M, N) lie at a run-time stride that keeps each row
    16-byte aligned (a slice x[:, :N] of wider rows), not densely. `strided_v`: an attention's
    third and fourth tensors (M, N, D), v and o, are (B, H, N, D) instead, B and H and every
    stride but the last's (1) known at run time, multiples of 16 bytes (a model's v, a transposed
    view; o in the layout the backward's kernel reads)."""
    import cutlass.cute as cute

    m = cute.sym_int()
    args: list[Any] = []
    shapes = [(tuple(dim_size(d, m, n) for d in t.dims), t.dtype or dtype) for t in spec.tensors]
    if workspace:
        shapes.append(((workspace,), "float32"))
    vo = (2, 3)  # (an attention's v and o)
    if strided_v and (len(spec.tensors) < 4 or any(len(shapes[i][0]) != 3 or spec.tensors[i].dims[:2] != ("M", "N")
                                                  for i in vo)):  # fmt: skip
        raise ValueError("strided v needs an attention's third and fourth tensors (M, N, D)")
    for i, (shape, dt) in enumerate(shapes):
        per16 = 128 // cute_type(dt).width  # (elements in 16 bytes: a run-time stride's multiple)
        if strided_rows and i == 0:
            if spec.tensors[0].dims != ("M", "N"):
                raise ValueError("strided rows need a first tensor of rows (M, N)")
            per_row = cute.sym_int(divisibility=per16)
            args.append(cute.runtime.make_fake_tensor(cute_type(dt), shape, (per_row, 1), assumed_align=16))
            continue
        if strided_v and i in vo:
            heads = (cute.sym_int(), cute.sym_int(), n, shape[2])
            strides = (*(cute.sym_int(divisibility=per16) for _ in range(3)), 1)
            args.append(cute.runtime.make_fake_tensor(cute_type(dt), heads, strides, assumed_align=16))
            continue
        args.append(
            cute.runtime.make_fake_compact_tensor(
                cute_type(dt), shape, stride_order=tuple(reversed(range(len(shape)))), assumed_align=16
            )
        )
    args += [scalar_value(v) for v in spec.scalars.values()]
    args.append(cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True))
    return args


def compile_entry(
    entry: Any,
    spec: OpSpec | Signature,
    dtype: str,
    n: int,
    options: str = "",
    workspace: int = 0,
    strided_rows: bool = False,
    strided_v: bool = False,
) -> Any:
    """Compile `entry` for (spec, dtype, n); the result is called with torch tensors then scalars
    (and, with a workspace, the workspace tensor after the outputs: see `with_workspace`).

    TVM-FFI calls take torch tensors directly and the current torch stream, so a launch costs a
    few microseconds of host time, not the tens that building DLPack views would."""
    ensure_arch()
    import cutlass.cute as cute

    opts = " ".join(o for o in ("--enable-tvm-ffi", options) if o)
    return cute.compile(entry, *fake_args(spec, dtype, n, workspace, strided_rows, strided_v), options=opts)


class WithWorkspace:
    """A compiled kernel called like one without a workspace: the scratch tensor is allocated
    once per device (outside any CUDA graph capture where possible) and passed after the outputs."""

    def __init__(self, fn: Any, n_tensors: int, elems: int) -> None:
        self.fn, self.n_tensors, self.elems = fn, n_tensors, elems
        self.buffers: dict[Any, Any] = {}

    def __call__(self, *args: Any) -> Any:
        import torch

        device = args[0].device
        ws = self.buffers.get(device)
        if ws is None:
            ws = self.buffers[device] = torch.empty(self.elems, dtype=torch.float32, device=device)
        return self.fn(*args[: self.n_tensors], ws, *args[self.n_tensors :])


def with_workspace(fn: Any, n_tensors: int, elems: int) -> Any:
    return WithWorkspace(fn, n_tensors, elems) if elems else fn


def load_module(path: str | Path, name: str | None = None) -> ModuleType:
    """Import a kernel module from a file; its name is derived from the content, so two
    different sources never share a module (nor its compiled kernels)."""
    path = Path(path)
    src = path.read_bytes()
    name = name or f"llmcompile_kernel_{hashlib.sha256(src).hexdigest()[:16]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[name]
        raise
    return mod


def entry_of(module: ModuleType) -> Any:
    try:
        return getattr(module, ENTRY)
    except AttributeError:
        raise AttributeError(f"kernel module defines no `{ENTRY}` (the kernel contract's entry)") from None
