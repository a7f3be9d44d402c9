"""The compiled-kernel artifact: what crosses from the candidate's sandbox to everything after it.

A candidate's compile step (sandboxed, the only place its Python runs) hands back, per N, the host
module CuTe DSL produced: LLVM-dialect MLIR with the GPU binary embedded as a constant. `seal` runs
in a trusted process that never imports candidate code: it parses that text, audits its host code
(calls only to the CUDA and TVM-FFI runtime entry points CuTe DSL itself emits, no inline assembly,
no indirect calls, no load-time constructors), renames its entry to ours, and exports one object
file. A compromised compile step can therefore change its own kernel, not what runs on the host.

An artifact directory holds `manifest.json` and one `n<N>.o` per N; the GPU worker, `best/` and
`llmcompile.loader` all load exactly these bytes (`load_functions`). `llmcompile.library.link`
adds a shared library of the same objects that loads without CuTe DSL.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FORMAT = 1
SYMBOL = "llmcompile_n{n}"
# External functions a CuTe DSL host module may call: the CUDA runtime shims and the CuTe DSL
# runtime (libcute_dsl_runtime), TVM-FFI's error and stream API, and printf (its error paths).
ALLOWED_EXTERNAL = re.compile(r"^(_cuda\w+|_cu[A-Z]\w+|cuda_dialect_\w+|CuteDSLRT_\w+|TVMFFI\w+|printf)$")
ALLOWED_OPS = re.compile(r"^(builtin\.module|llvm\.[a-z_.0-9]+)$")
REFUSED_OPS = {"llvm.inline_asm", "llvm.mlir.global_ctors", "llvm.call_intrinsic"}
TVM_FFI_PREFIX = "__tvm_ffi_"


class ArtifactError(ValueError):
    """A module or artifact that the judge will not load, with the reason."""


@dataclass
class ArtifactManifest:
    op: str
    dtype: str
    objects: dict[str, str]  # str(N) -> object file name
    symbols: dict[str, str]  # str(N) -> TVM-FFI function name in that object
    sha256: dict[str, str]  # object file name -> its hash
    tensors: list[str] = field(default_factory=list)  # the entry's argument order
    scalars: list[str] = field(default_factory=list)
    launches: dict[str, dict[str, list[int]]] = field(default_factory=dict)  # str(N) -> kernel -> [threads, smem]
    source_sha: str = ""
    cute_dsl: str = ""
    format: int = FORMAT
    workspace: int = 0  # fp32 scratch elements passed after the outputs (kernel contract, rule 6)
    library: str = ""  # the objects linked into one shared library (llmcompile.library), if done
    call: dict[str, Any] = field(default_factory=dict)  # callpath.CallSpec: how to call it, without the op


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

    from llmcompile.harness.compiler import check_launchable, parse_launches

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


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def cute_dsl_version() -> str:
    import importlib.metadata as md

    try:
        return md.version("nvidia-cutlass-dsl")
    except md.PackageNotFoundError:
        return ""


def manifest_for(
    op: str,
    dtype: str,
    objects: dict[str, bytes],
    launches: dict[str, dict[str, list[int]]],
    tensors: list[str],
    scalars: list[str],
    source: str,
    workspace: int,
    call: dict[str, Any],
) -> tuple[ArtifactManifest, dict[str, bytes]]:
    """The manifest of sealed objects given by N (as str), and the files it names: how the judge
    and `llmcompile export` both write an artifact."""
    files = {f"n{n}.o": data for n, data in objects.items()}
    man = ArtifactManifest(
        op=op,
        dtype=dtype,
        objects={n: f"n{n}.o" for n in objects},
        symbols={n: SYMBOL.format(n=n) for n in objects},
        sha256={name: sha256(data) for name, data in files.items()},
        tensors=tensors,
        scalars=scalars,
        launches=launches,
        source_sha=sha256(source.encode()),
        cute_dsl=cute_dsl_version(),
        workspace=workspace,
        call=call,
    )
    return man, files


def write(directory: Path, manifest: ArtifactManifest, objects: dict[str, bytes]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in objects.items():
        (directory / name).write_bytes(data)
    (directory / "manifest.json").write_text(json.dumps(asdict(manifest), indent=1))
    return directory


def read(directory: str | Path) -> ArtifactManifest:
    d = Path(directory)
    try:
        data = json.loads((d / "manifest.json").read_text())
    except (OSError, ValueError) as e:
        raise ArtifactError(f"{d} is not a kernel artifact (manifest.json: {e})") from None
    if data.get("format") != FORMAT:
        raise ArtifactError(f"{d}: artifact format {data.get('format')} is not {FORMAT}")
    return ArtifactManifest(**data)


def checked_bytes(directory: Path, man: ArtifactManifest, name: str) -> bytes:
    """A file of the artifact, refused unless it matches the hash its manifest records."""
    data = (directory / name).read_bytes()
    if sha256(data) != man.sha256.get(name):
        raise ArtifactError(f"{directory / name} does not match the hash in its manifest")
    return data


def load_functions(directory: str | Path) -> tuple[ArtifactManifest, dict[int, Any]]:
    """The artifact's kernels as callables on torch tensors (inputs, outputs, scalars), by N,
    with their workspace (if any) bound. Each object's hash is checked against the manifest
    before it is loaded."""
    import cutlass.runtime

    from llmcompile import contract

    d = Path(directory)
    man = read(d)
    try:
        contract.check_workspace(man.workspace)
    except ValueError as e:
        raise ArtifactError(f"{d}: {e}") from None
    fns: dict[int, Any] = {}
    for n, name in man.objects.items():
        checked_bytes(d, man, name)
        module = cutlass.runtime.load_module(str(d / name), enable_tvm_ffi=True)
        fns[int(n)] = contract.with_workspace(getattr(module, man.symbols[n]), len(man.tensors), man.workspace)
    return man, fns
