"""Shared-library artifacts: a kernel that loads with TVM-FFI alone, without CuTe DSL.

`link` turns an artifact's sealed object files (one per N, each exporting the TVM-FFI function
`llmcompile_n<N>`) into one `kernels.so`: the objects, CuTe DSL's small static CUDA runtime
shims (libcuda_dialect_runtime_static.a, 52 KB) and `runtime_shim.c` (the one runtime entry
that archive lacks). What stays undefined is the CUDA runtime's API and TVM-FFI's, which the
process that loads it has: torch's libcudart and the apache-tvm-ffi package. `load_functions`
loads such a library with `tvm_ffi.load_module` and never imports CuTe DSL; from C++ the same
library opens with `tvm::ffi::Module::LoadFromFile` and its functions by the manifest's symbols.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from llmcompile.runtime import artifact
from llmcompile.runtime.artifact import ArtifactError, ArtifactManifest
from llmcompile.runtime.seal import TVM_FFI_PREFIX
from llmcompile.specs import contract

LIBRARY = "kernels.so"
SHIM = Path(__file__).resolve().parent / "runtime_shim.c"
STATIC_RUNTIME = "libcuda_dialect_runtime_static.a"
# Left undefined in a linked library, these would need CuTe DSL's own runtime at load time.
CUTE_RUNTIME_SYMBOL = re.compile(r"^(_cu\w+|cuda_dialect_\w+|CuteDSLRT_\w+)$")


def static_runtime() -> Path:
    """CuTe DSL's static CUDA runtime archive, found without importing CuTe DSL."""
    spec = importlib.util.find_spec("cutlass")
    if spec is None or not spec.origin:
        raise ArtifactError("linking a kernel library needs CuTe DSL (pip install nvidia-cutlass-dsl)")
    # .../nvidia_cutlass_dsl/dsl_packages/cutlass/__init__.py -> .../nvidia_cutlass_dsl/cu*/lib/
    root = Path(spec.origin).resolve().parents[2]
    found = sorted(root.glob(f"cu*/lib/{STATIC_RUNTIME}"))
    if not found:
        raise ArtifactError(f"CuTe DSL at {root} has no {STATIC_RUNTIME}")
    return found[-1]


def _tvm_ffi_library() -> Path:
    import tvm_ffi.libinfo

    return Path(tvm_ffi.libinfo.find_libtvm_ffi())


def _dynamic_symbols(path: Path, which: str) -> list[str]:
    nm = shutil.which("nm")
    if nm is None:
        raise ArtifactError("checking a kernel library needs `nm` (binutils)")
    out = subprocess.run([nm, "-D", which, str(path)], capture_output=True, text=True, check=True).stdout
    return [line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()]


def undefined_symbols(path: Path) -> list[str]:
    """The dynamic symbols `path` needs from elsewhere (nm), without their version tags."""
    return _dynamic_symbols(path, "--undefined-only")


def exported_symbols(path: Path) -> list[str]:
    return _dynamic_symbols(path, "--defined-only")


def link(directory: str | Path) -> ArtifactManifest:
    """Link the artifact in `directory` into `kernels.so` beside its objects and record it in the
    manifest (its hash too); returns the new manifest."""
    d = Path(directory)
    man = artifact.read(d)
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        raise ArtifactError("linking a kernel library needs a C compiler (cc or gcc on PATH, or CC)")
    objects = []
    for name in man.objects.values():
        artifact.checked_bytes(d, man, name)
        objects.append(str(d / name))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / LIBRARY
        cmd = [cc, "-shared", "-fPIC", "-O2", "-o", str(out), str(SHIM), *objects, str(static_runtime())]
        cmd += [str(_tvm_ffi_library())]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise ArtifactError(f"linking {LIBRARY} failed: {(done.stderr or done.stdout)[-1500:]}")
        missing = [s for s in undefined_symbols(out) if CUTE_RUNTIME_SYMBOL.match(s)]
        if missing:
            raise ArtifactError(
                f"{LIBRARY} would need CuTe DSL's runtime for {', '.join(sorted(set(missing))[:8])}: not exportable"
            )
        exported = set(exported_symbols(out))
        absent = [s for s in man.symbols.values() if TVM_FFI_PREFIX + s not in exported]
        if absent:
            raise ArtifactError(f"{LIBRARY} does not export {', '.join(absent)}")
        data = out.read_bytes()
    (d / LIBRARY).write_bytes(data)
    man = replace(man, library=LIBRARY, sha256={**man.sha256, LIBRARY: artifact.sha256(data)})
    artifact.write(d, man, {})
    return man


def _cuda_runtime_global() -> None:
    """Make the process's CUDA runtime (the one torch loaded) visible to libraries loaded next:
    the linked library leaves the CUDA runtime API undefined, to be the caller's own."""
    import torch

    if not torch.cuda.is_available():
        return  # nothing will run; the library still loads (its CUDA calls bind lazily)
    torch.cuda.init()
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split(None, 5)[-1] if len(line.split(None, 5)) == 6 else ""
        if "/libcudart.so" in path:
            ctypes.CDLL(path, mode=os.RTLD_GLOBAL | os.RTLD_NOLOAD)
            return
    raise ArtifactError("torch's CUDA runtime (libcudart) is not loaded in this process: cannot bind a kernel library")


def load_functions(directory: str | Path) -> tuple[ArtifactManifest, dict[int, Any], Any]:
    """The library's kernels by N as callables on torch tensors (workspace bound), and the
    TVM-FFI module that must stay alive while they are used. Imports no CuTe DSL."""
    import tvm_ffi

    d = Path(directory)
    man = artifact.read(d)
    if not man.library:
        raise ArtifactError(f"{d} has no linked library (llmcompile export writes one)")
    try:
        contract.check_workspace(man.workspace)
    except ValueError as e:
        raise ArtifactError(f"{d}: {e}") from None
    artifact.checked_bytes(d, man, man.library)
    _cuda_runtime_global()
    module = tvm_ffi.load_module(str(d / man.library))
    fns = {
        int(n): contract.with_workspace(module.get_function(sym), len(man.tensors), man.workspace)
        for n, sym in man.symbols.items()
    }
    return man, fns, module
