"""Sealing: a candidate's compiled host module, turned into an object file the judge will run.

A candidate's compile step (sandboxed, the only place its Python runs) hands back, per N, the host
module CuTe DSL produced: LLVM-dialect MLIR with the GPU binary embedded as a constant. `seal` runs
in a trusted process that never imports candidate code: it parses that text, audits its host code
(calls only to the CUDA and TVM-FFI runtime entry points CuTe DSL itself emits, no inline assembly,
no indirect calls, no load-time constructors), renames its entry to ours, and exports one object
file: the artifact's (runtime/artifact.py). A compromised compile step can therefore change its
own kernel, not what runs on the host.
"""

from __future__ import annotations

import re
from typing import Any

from llmcompile.runtime.artifact import SYMBOL, ArtifactError
from llmcompile.runtime.launches import check_launchable, parse_launches

ALLOWED_EXTERNAL = re.compile(r"^(_cuda\w+|_cu[A-Z]\w+|cuda_dialect_\w+|CuteDSLRT_\w+|TVMFFI\w+|printf)$")
ALLOWED_OPS = re.compile(r"^(builtin\.module|llvm\.[a-z_.0-9]+)$")
REFUSED_OPS = {"llvm.inline_asm", "llvm.mlir.global_ctors", "llvm.call_intrinsic"}
TVM_FFI_PREFIX = "__tvm_ffi_"


def audit(module: Any) -> list[str]:
    """Problems with a parsed host module's code; empty when it only does what CuTe DSL emits."""
    problems: list[str] = []
    defined: set[str] = set()
    external: set[str] = set()
    calls: list[tuple[str | None, str]] = []

    def visit(op: Any) -> None:
        name = op.name
        if name in REFUSED_OPS or not ALLOWED_OPS.match(name):
            problems.append(f"host code uses `{name}`")
        if name == "llvm.func":
            sym = op.attributes["sym_name"].value
            (defined if len(op.regions[0].blocks) else external).add(sym)
        elif name == "llvm.call":
            callee = op.attributes["callee"].value if "callee" in op.attributes else None
            calls.append((callee, name))
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    visit(inner.operation)

    visit(module.operation)
    for sym in sorted(external):
        if not ALLOWED_EXTERNAL.match(sym):
            problems.append(f"host code declares the external function `{sym}`")
    for callee, _ in calls:
        if callee is None:
            problems.append("host code makes an indirect call")
        elif callee not in defined and callee not in external:
            problems.append(f"host code calls the unknown symbol `{callee}`")
    return list(dict.fromkeys(problems))


def seal(mlir_text: str, n: int) -> tuple[bytes, dict[str, list[int]]]:
    """Audit one host module and export it as an object file whose TVM-FFI entry is
    `SYMBOL.format(n)`; also the launches it makes (threads, dynamic shared memory)."""
    from cutlass._mlir import ir
    from cutlass._mlir._mlir_libs._cutlass_ir import _aot_support
    from cutlass.base_dsl.export import get_export_module
    from cutlass.cutlass_dsl.tvm_ffi_provider import rename_tvm_ffi_function

    launches = parse_launches(mlir_text)
    check_launchable(launches)
    symbol = SYMBOL.format(n=n)
    with ir.Context():
        try:
            module = ir.Module.parse(mlir_text)
        except Exception as e:  # noqa: BLE001 - whatever the parser says, the module is refused
            raise ArtifactError(f"the compiled module does not parse: {str(e)[:300]}") from None
        if problems := audit(module):
            raise ArtifactError("the compiled host code was refused: " + "; ".join(problems[:5]))
        funcs = {
            f.attributes["sym_name"].value
            for f in module.body.operations
            if f.operation.name == "llvm.func" and len(f.operation.regions[0].blocks)
        }
        # the entry's TVM-FFI wrapper is named after the host function it wraps (helpers are not)
        entries = [
            f[len(TVM_FFI_PREFIX) :]
            for f in funcs
            if f.startswith(TVM_FFI_PREFIX) and f[len(TVM_FFI_PREFIX) :] in funcs
        ]
        if len(entries) != 1:
            raise ArtifactError(f"the compiled module has {len(entries)} TVM-FFI entry points, not one")
        export = get_export_module(module, f"__cute_internal_{symbol}", preserve_symbols={TVM_FFI_PREFIX + entries[0]})
        rename_tvm_ffi_function(export, entries[0], symbol)
        obj = _aot_support.export_module_to_bytes(export, format="o", opt_level=3, enable_pic=True)
    return bytes(obj), {k: list(v) for k, v in launches.items()}
