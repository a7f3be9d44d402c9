"""The compiled-kernel artifact: the one format the judge verifies and times, `best/` keeps and
`llmcompile export` ships.

An artifact directory holds `manifest.json` and one `n<N>.o` per N (each an object file the
judge sealed: `harness/seal.py`); the GPU worker, `best/` and `llmcompile.loader` all load exactly
these bytes (`load_functions`), each checked against the hash its manifest records.
`runtime.library.link` adds a shared library of the same objects that loads without CuTe DSL.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FORMAT = 1
SYMBOL = "llmcompile_n{n}"
# External functions a CuTe DSL host module may call: the CUDA runtime shims and the CuTe DSL
# runtime (libcute_dsl_runtime), TVM-FFI's error and stream API, and printf (its error paths).


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
    library: str = ""  # the objects linked into one shared library (llmcompile.runtime.library), if done
    call: dict[str, Any] = field(default_factory=dict)  # callpath.CallSpec: how to call it, without the op


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

    from llmcompile.specs import contract

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
