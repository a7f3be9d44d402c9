"""Torch-facing functions over kernel-contract modules: `llmcompile.kernels.softmax(x)` etc.

Each function compiles its kernel once per (dtype, N) with M symbolic and keeps it in memory;
CuTe DSL's own file cache (under ~/.cache/llmcompile/cute unless CUTE_DSL_CACHE_DIR is set)
keeps the compiled code on disk across processes. Each is also a torch.library custom op
(`torch.ops.llmcompile.<name>`), so torch.compile can call it as one opaque kernel.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from llmcompile import contract
from llmcompile.harness.compiler import check_launchable, launches_of
from llmcompile.ops import OpError, OpSpec, dtype_name, get_op

os.environ.setdefault("CUTE_DSL_CACHE_DIR", str(Path.home() / ".cache" / "llmcompile" / "cute"))

_LIB = torch.library.Library("llmcompile", "FRAGMENT")
_ALIGN = 16


def _schema(spec: OpSpec) -> str:
    parts = [f"Tensor {t.name}" for t in spec.inputs]
    parts += [f"Tensor(a{i}!) {t.name}" for i, t in enumerate(spec.outputs)]
    parts += [f"{'int' if isinstance(v, int) else 'float'} {k}" for k, v in spec.scalars.items()]
    return f"({', '.join(parts)}) -> ()"


class KernelFunction:
    """A kernel-contract entry made callable on torch tensors, for one op spec."""

    def __init__(
        self,
        spec: OpSpec,
        entry: Any,
        op_name: str | None = None,
        precompiled: dict[tuple[str, int], Any] | None = None,
        workspace: int = 0,
    ) -> None:
        self.spec = spec
        self.entry = entry  # None: only the precompiled kernels exist (a loaded artifact)
        self.workspace = workspace  # the entry's (kernel contract, rule 6); precompiled ones bind theirs
        self._compiled: dict[tuple[str, int], Any] = dict(precompiled or {})
        self._lock = threading.Lock()
        self.op_name = op_name
        if op_name is not None:
            _LIB.define(f"{op_name}{_schema(spec)}")
            _LIB.impl(op_name, self._launch, "CUDA")
            torch.library.register_fake(f"llmcompile::{op_name}", lib=_LIB)(lambda *a, **k: None)

    def compiled(self, dtype: str, n: int) -> Any:
        key = (dtype, n)
        with self._lock:
            if key not in self._compiled:
                if self.entry is None:
                    have = ", ".join(f"{d} N={k}" for d, k in sorted(self._compiled))
                    raise OpError(f"{self.spec.name}: this artifact has kernels for {have}, not {dtype} N={n}")
                fn = contract.compile_entry(self.entry, self.spec, dtype, n, workspace=self.workspace)
                check_launchable(launches_of(fn))
                self._compiled[key] = contract.with_workspace(fn, len(self.spec.tensors), self.workspace)
            return self._compiled[key]

    def _launch(self, *args: Any) -> None:
        tensors = args[: len(self.spec.tensors)]
        scalars = args[len(self.spec.tensors) :]
        x = tensors[0]
        self.compiled(dtype_name(x.dtype), x.shape[-1])(*tensors, *scalars)

    def _run(self, ins: list[torch.Tensor], outs: list[torch.Tensor], vals: list) -> None:
        if self.op_name is not None:
            getattr(torch.ops.llmcompile, self.op_name)(*ins, *outs, *vals)
        else:
            self.compiled(dtype_name(ins[0].dtype), ins[0].shape[-1])(*ins, *outs, *vals)

    def prepare(self, *inputs: torch.Tensor) -> tuple[list[torch.Tensor], int, int, str]:
        """Validate inputs against the spec; flatten leading dims into M; make them
        contiguous and 16-byte aligned (copies only where they are not)."""
        spec = self.spec
        if len(inputs) != len(spec.inputs):
            names = ", ".join(t.name for t in spec.inputs)
            raise OpError(f"{spec.name} takes {len(spec.inputs)} tensors ({names}), got {len(inputs)}")
        x = inputs[0]
        if not spec.flat_rows:
            return self._prepare_fixed(inputs)
        if x.dim() < 1 or x.shape[-1] == 0:
            raise OpError(f"{spec.name}: x must have a non-empty last dimension, got shape {tuple(x.shape)}")
        if not x.is_cuda:
            raise OpError(f"{spec.name}: tensors must be on a CUDA device, x is on {x.device}")
        dtype = dtype_name(x.dtype)
        n = x.shape[-1]
        m = x.numel() // n
        spec.check_problem(max(m, 1), n, dtype)
        out = []
        for t, v in zip(spec.inputs, inputs):
            want = t.torch_dtype(dtype)
            if t.dims == ("M", "N"):
                v = v.reshape(m, n)
            elif t.dims == ("M",):
                v = v.reshape(m)
            expect = t.shape(m, n)
            if tuple(v.shape) != expect or v.dtype != want:
                raise OpError(
                    f"{spec.name}: {t.name} must be {want} of shape {expect} "
                    f"(from x of shape {tuple(x.shape)}), got {v.dtype} {tuple(v.shape)}"
                )
            if v.device != x.device:
                raise OpError(f"{spec.name}: {t.name} is on {v.device}, x on {x.device}")
            if not v.is_contiguous() or v.data_ptr() % _ALIGN:
                v = v.contiguous() if not v.is_contiguous() else v.clone()
            out.append(v)
        return out, m, n, dtype

    def _prepare_fixed(self, inputs: tuple[torch.Tensor, ...]) -> tuple[list[torch.Tensor], int, int, str]:
        """Custom ops: every tensor has its problem's shape, with the leading M free."""
        spec, x = self.spec, inputs[0]
        if not x.is_cuda:
            raise OpError(f"{spec.name}: tensors must be on a CUDA device, x is on {x.device}")
        m, n, dtype = x.shape[0], x.shape[-1], spec.dtypes[0]
        out = []
        for t, v in zip(spec.inputs, inputs):
            expect, want = t.shape(m, n), t.torch_dtype(dtype)
            if tuple(v.shape) != expect or v.dtype != want:
                raise OpError(f"{spec.name}: {t.name} must be {want} of shape {expect}, got {v.dtype} {tuple(v.shape)}")
            if not v.is_contiguous():
                v = v.contiguous()
            elif v.data_ptr() % _ALIGN:
                v = v.clone()
            out.append(v)
        return out, m, n, dtype

    def __call__(self, *inputs: torch.Tensor, **scalars: float | int) -> torch.Tensor | list[torch.Tensor]:
        unknown = set(scalars) - set(self.spec.scalars)
        if unknown:
            raise OpError(f"{self.spec.name} takes no argument {', '.join(sorted(unknown))}")
        lead = inputs[0].shape[:-1]
        ins, m, n, dtype = self.prepare(*inputs)
        if not self.spec.flat_rows:
            outs = self.spec.alloc_outputs(m, n, dtype, str(ins[0].device))
            if m > 0:
                self._run(ins, outs, [])
            return outs[0] if len(outs) == 1 else outs
        outs = self.spec.alloc_outputs(m, n, dtype, str(ins[0].device))
        vals = [type(v)(scalars.get(k, v)) for k, v in self.spec.scalars.items()]
        if m > 0:
            self._run(ins, outs, vals)
        shaped = [o.reshape(*lead, *o.shape[1:]) if o.dim() == 2 else o.reshape(lead) for o in outs]
        return shaped[0] if len(shaped) == 1 else shaped


def reference_function(op: str, knobs: Any = None, register: bool = False) -> KernelFunction:
    """The reference kernel of `op` (optionally with tuning knobs) as a torch function."""
    spec = get_op(op)
    mod = importlib.import_module(f"reference_kernels.{spec.reference_module}")
    entry = contract.entry_of(mod) if knobs is None else type(contract.entry_of(mod))(knobs)
    return KernelFunction(spec, entry, op_name=op if register else None, workspace=contract.workspace_of(mod))


copy = reference_function("copy", register=True)
softmax = reference_function("softmax", register=True)
log_softmax = reference_function("log_softmax", register=True)
rmsnorm = reference_function("rmsnorm", register=True)
layernorm = reference_function("layernorm", register=True)
cross_entropy = reference_function("cross_entropy", register=True)

BY_NAME: dict[str, KernelFunction] = {
    "copy": copy,
    "softmax": softmax,
    "log_softmax": log_softmax,
    "rmsnorm": rmsnorm,
    "layernorm": layernorm,
    "cross_entropy": cross_entropy,
}


def copy_probe(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Our CuTe copy (bf16 rows) for the copy-bandwidth measurement: dst = src."""
    copy.compiled("bfloat16", src.shape[1])(src, dst)


def cross_entropy_read_probe(elems: int) -> tuple[Callable[[], object], int]:
    """Our cross-entropy over fp32 rows of 16K as a read-only stream (it writes 4 bytes a row),
    and the bytes it reads: on an H200 it reads faster than torch's row reductions (4.5 vs 4.1
    TB/s), so the plausibility ceiling must know about it."""
    spec = get_op("cross_entropy")
    n = 16384
    x = torch.randn(max(elems // n, 1), n, device="cuda")
    fn = cross_entropy.compiled("float32", n)
    target = torch.zeros(x.shape[0], dtype=torch.int64, device=x.device)
    loss = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    return (lambda: fn(x, target, loss, *spec.scalars.values())), x.nbytes


READ_PROBES = {"cute cross_entropy fp32": cross_entropy_read_probe}
