"""The reference kernels as torch functions (`llmcompile.kernels` adds their autograd): each a
`KernelFunction` over a kernel-contract module.

Each function compiles its kernel once per (dtype, N) with M symbolic and keeps it in memory;
CuTe DSL's own file cache (under ~/.cache/llmcompile/cute unless CUTE_DSL_CACHE_DIR is set)
keeps the compiled code on disk across processes. Each is also a torch.library custom op
(`torch.ops.llmcompile.<name>`), so torch.compile can call it as one opaque kernel. How a call
reaches the kernel (a lean path, decided once per (dtype, N)): `runtime/callpath.py`.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from llmcompile.runtime.callpath import KernelFunction
from llmcompile.runtime.launches import check_launchable, launches_of
from llmcompile.specs import OpError, OpSpec, contract, get_op

os.environ.setdefault("CUTE_DSL_CACHE_DIR", str(Path.home() / ".cache" / "llmcompile" / "cute"))


def compiler_of(
    spec: OpSpec, entry: Any, workspace: int = 0, strided_rows: bool = False, strided_v: bool = False
) -> Callable[[str, int], Any]:
    """`entry` compiled on demand per (dtype, N), as `KernelFunction` asks for it (`strided_rows`:
    for x's rows at a run-time stride, a slice of wider rows; `strided_v`: an attention's v and o of
    (B, H, N, D) at run-time strides)."""

    def compile_one(dtype: str, n: int) -> Any:
        fn = contract.compile_entry(
            entry, spec, dtype, n, workspace=workspace, strided_rows=strided_rows, strided_v=strided_v
        )
        check_launchable(launches_of(fn))
        return contract.with_workspace(fn, len(spec.tensors), workspace)

    return compile_one


def vectors_in_fp32(spec: OpSpec) -> OpSpec | None:
    """`spec` with its (N,) tensors (a norm's weight and bias, their gradients) in fp32 whatever
    x's dtype, as mixed-precision training keeps weights; None for an op without them."""
    if not any(t.dims == ("N",) and t.dtype is None for t in spec.tensors):
        return None
    tensors = tuple(dataclasses.replace(t, dtype="float32") if t.dims == ("N",) else t for t in spec.tensors)
    return dataclasses.replace(spec, tensors=tensors, dtypes=tuple(d for d in spec.dtypes if d != "float32"))


def reference_function(op: str, knobs: Any = None, register: bool = False) -> KernelFunction:
    """The reference kernel of `op` (a row op optionally with RowKnobs) as a torch function."""
    spec = get_op(op)
    if knobs is not None and not spec.flat_rows:
        # (an attention entry's first argument is `causal`: its knobs go to its own constructor)
        raise OpError(f"{op}: knobs here are a row op's RowKnobs; build {op}'s entry with its own knobs")
    mod = importlib.import_module(f"reference_kernels.{spec.reference_module}")
    entry = contract.entry_of(mod) if knobs is None else type(contract.entry_of(mod))(knobs)
    ws = contract.workspace_of(mod)
    # (row ops: x's rows at a stride; an attention kernel that reads v where it lies: v strided)
    strided = (
        compiler_of(spec, entry, ws, strided_rows=True)
        if spec.flat_rows
        else compiler_of(spec, entry, ws, strided_v=True)
        if getattr(entry, "takes_strided_v", False)
        else None
    )
    fn = KernelFunction(spec, compiler_of(spec, entry, ws), op_name=op if register else None, compile_strided=strided)
    mixed = vectors_in_fp32(spec) if spec.flat_rows else None
    if mixed is not None:
        fn.vectors32 = KernelFunction(
            mixed, compiler_of(mixed, entry, ws), compile_strided=compiler_of(mixed, entry, ws, strided_rows=True)
        )
    return fn


copy = reference_function("copy", register=True)
softmax = reference_function("softmax", register=True)
log_softmax = reference_function("log_softmax", register=True)
rmsnorm = reference_function("rmsnorm", register=True)
layernorm = reference_function("layernorm", register=True)
cross_entropy = reference_function("cross_entropy", register=True)
cross_entropy_fwd = reference_function("cross_entropy_fwd", register=True)
softmax_bwd = reference_function("softmax_bwd", register=True)
log_softmax_bwd = reference_function("log_softmax_bwd", register=True)
softmax_bwd_scalar = reference_function("softmax_bwd_scalar", register=True)
log_softmax_bwd_scalar = reference_function("log_softmax_bwd_scalar", register=True)
cross_entropy_bwd = reference_function("cross_entropy_bwd", register=True)
rmsnorm_fwd = reference_function("rmsnorm_fwd", register=True)
rmsnorm_bwd = reference_function("rmsnorm_bwd", register=True)
rmsnorm_bwd_scalar = reference_function("rmsnorm_bwd_scalar", register=True)
layernorm_fwd = reference_function("layernorm_fwd", register=True)
layernorm_bwd = reference_function("layernorm_bwd", register=True)
layernorm_bwd_scalar = reference_function("layernorm_bwd_scalar", register=True)
cross_entropy_fused = reference_function("cross_entropy_fused", register=True)
cross_entropy_fused_total = reference_function("cross_entropy_fused_total", register=True)
cross_entropy_total = reference_function("cross_entropy_total", register=True)
scale = reference_function("scale", register=True)
# (M, N, D) = (batch x heads, sequence, head dim); compute-bound, rated in TFLOP/s
attention = reference_function("attention", register=True)
attention_causal = reference_function("attention_causal", register=True)
attention_d64 = reference_function("attention_d64", register=True)
attention_causal_d64 = reference_function("attention_causal_d64", register=True)
# each with its C++ call (autograd_native's slot of its index): keep the order
ATTENTIONS = (attention, attention_causal, attention_d64, attention_causal_d64)


def attention_flags(fn: KernelFunction) -> tuple[bool, float]:
    """An attention kernel function's causal flag and default scale, as its autograd calls (the
    Python Function's and the C++ node's) take them."""
    return "causal" in fn.spec.name, float(fn.spec.scalars["scale"])


BY_NAME: dict[str, KernelFunction] = {
    "copy": copy,
    "softmax": softmax,
    "log_softmax": log_softmax,
    "rmsnorm": rmsnorm,
    "layernorm": layernorm,
    "cross_entropy": cross_entropy,
    "cross_entropy_fwd": cross_entropy_fwd,
    "softmax_bwd": softmax_bwd,
    "log_softmax_bwd": log_softmax_bwd,
    "softmax_bwd_scalar": softmax_bwd_scalar,
    "log_softmax_bwd_scalar": log_softmax_bwd_scalar,
    "cross_entropy_bwd": cross_entropy_bwd,
    "rmsnorm_fwd": rmsnorm_fwd,
    "rmsnorm_bwd": rmsnorm_bwd,
    "rmsnorm_bwd_scalar": rmsnorm_bwd_scalar,
    "layernorm_fwd": layernorm_fwd,
    "layernorm_bwd": layernorm_bwd,
    "layernorm_bwd_scalar": layernorm_bwd_scalar,
    "cross_entropy_fused": cross_entropy_fused,
    "cross_entropy_fused_total": cross_entropy_fused_total,
    "cross_entropy_total": cross_entropy_total,
    "scale": scale,
    "attention": attention,
    "attention_causal": attention_causal,
    "attention_d64": attention_d64,
    "attention_causal_d64": attention_causal_d64,
}


_SCALE_IN_PLACE: dict[tuple[torch.dtype, int], Any] = {}


def scale_(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """x *= a[0] * b[0] in place, x dense rows (a fused loss's kept gradient), a and b (1,) fp32 on
    the device: `scale`'s kernel with x as its output too (each element is read before it is
    written, by the same thread), one launch and no sync; out of place where torch.compile traces."""
    if torch.compiler.is_compiling():
        return scale(x, a, b)
    a = a if a.data_ptr() % 16 == 0 else a.clone()  # (a 0-d upstream gradient may be a view anywhere)
    key = (x.dtype, x.shape[-1])
    fn = _SCALE_IN_PLACE.get(key)
    if fn is None:
        fn = _SCALE_IN_PLACE[key] = scale.compiled(str(x.dtype).removeprefix("torch."), x.shape[-1])
    fn(x, a, b, x)
    return x


def copy_probe(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Our CuTe copy (bf16 rows) for the copy-bandwidth measurement: dst = src."""
    copy.compiled("bfloat16", src.shape[1])(src, dst)


CE_PROBE_N = 16384  # the read probe's row length


def cross_entropy_read_probe(elems: int) -> tuple[Callable[[], object], int]:
    """Our cross-entropy over fp32 rows of 16K as a read-only stream (it writes 4 bytes a row),
    and the bytes it reads: on an H200 it reads faster than torch's row reductions (4.5 vs 4.1
    TB/s), so the plausibility ceiling must know about it."""
    spec = get_op("cross_entropy")
    n = CE_PROBE_N
    x = torch.randn(max(elems // n, 1), n, device="cuda")
    fn = cross_entropy.compiled("float32", n)
    target = torch.zeros(x.shape[0], dtype=torch.int64, device=x.device)
    loss = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    return (lambda: fn(x, target, loss, *spec.scalars.values())), x.nbytes


READ_PROBES = {"cute cross_entropy fp32": cross_entropy_read_probe}
