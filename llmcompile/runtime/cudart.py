"""Torch's CUDA runtime under CuTe DSL's JIT-compiled kernels.

CuTe DSL binds a JIT kernel's host code to libcute_dsl_runtime.so, which carries a CUDA runtime
of its own, linked in statically. Launched through it, a log_softmax kernel cost 4.3-4.7 us more
host time than the same kernel linked against torch's libcudart (H200, 1000 paired launches,
issue 47), and a small training step is host-bound. `use_torch_cudart` builds, once per machine
and CUDA runtime, a small library of CuTe DSL's runtime entries (its static archive, and the one
entry it lacks, `runtime_shim.c`) over torch's libcudart, and loads it into the process's global
scope before the first compile (`compiled.py` calls it): the JIT then binds each kernel's host code
to it. libcute_dsl_runtime.so, loaded after it, still serves any entry the archive lacks. An
exported kernel (`library.py`) is linked the same way. LLMCOMPILE_TORCH_CUDART=0 keeps CuTe DSL's
own runtime, as does a CUTE_DSL_LIBS the caller set, or a CuTe DSL kernel loaded in the process
before ours; a machine where the library cannot be built keeps it too, and says so once.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
import sys
from pathlib import Path

from llmcompile.runtime.native_call import cache_dir, compile_into, compiler

SHIM = Path(__file__).resolve().parent / "runtime_shim.c"
STATIC_RUNTIME = "libcuda_dialect_runtime_static.a"
JIT_RUNTIME = "libcute_dsl_runtime.so"
LIBS_ENV = "CUTE_DSL_LIBS"
SWITCH_ENV = "LLMCOMPILE_TORCH_CUDART"
_state: dict[str, Path | None] = {}


def static_runtime() -> Path:
    """CuTe DSL's static CUDA runtime archive, found without importing CuTe DSL (OSError if none)."""
    spec = importlib.util.find_spec("cutlass")
    if spec is None or not spec.origin:
        raise OSError("linking against CuTe DSL's runtime needs CuTe DSL (pip install nvidia-cutlass-dsl)")
    # .../nvidia_cutlass_dsl/dsl_packages/cutlass/__init__.py -> .../nvidia_cutlass_dsl/cu*/lib/
    root = Path(spec.origin).resolve().parents[2]
    found = sorted(root.glob(f"cu*/lib/{STATIC_RUNTIME}"))
    if not found:
        raise OSError(f"CuTe DSL at {root} has no {STATIC_RUNTIME}")
    return found[-1]


def loaded_cudart() -> Path | None:
    """The libcudart this process has loaded (a CUDA build of torch's), else None."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(None, 5)
        if len(fields) == 6 and "/libcudart.so" in fields[5]:
            return Path(fields[5].strip())
    return None


def bridge_path(cudart: Path) -> Path:
    """Where the library over `cudart` is cached: a new archive, shim or runtime is a new file."""
    key = hashlib.sha256(static_runtime().read_bytes() + SHIM.read_bytes() + str(cudart).encode()).hexdigest()[:16]
    return cache_dir() / f"cute-runtime-{key}.so"


def build_bridge(cudart: Path) -> Path:
    """The archive's entries and the shim as one library that needs `cudart` (cached)."""
    path = bridge_path(cudart)
    if not path.is_file():
        cc = compiler("CC", ("cc", "gcc"), "C compiler")
        # every entry exported (the JIT looks them up by name); -Bsymbolic: the archive's calls among
        # its own entries stay inside it, not bound to libcute_dsl_runtime.so's of the same names
        whole = ["-Wl,--whole-archive", str(static_runtime()), "-Wl,--no-whole-archive"]
        compile_into(path, cc, ["-Wl,-Bsymbolic"], SHIM, [*whole, str(cudart), f"-Wl,-rpath,{cudart.parent}"])
    return path


def jit_runtime_loaded() -> bool:
    """Whether CuTe DSL's JIT has loaded its own runtime library in this process yet."""
    return JIT_RUNTIME in Path("/proc/self/maps").read_text()


def use_torch_cudart(runtime: Path | None = None) -> Path | None:
    """Bind every CuTe DSL kernel compiled or loaded from here on to the library over `runtime`
    (torch's CUDA runtime where None); the library, or None where CuTe DSL's own runtime stays:
    torch without CUDA, LLMCOMPILE_TORCH_CUDART=0, CUTE_DSL_LIBS set by the caller, a kernel
    already JIT-loaded in this process (its runtime then comes first), no C compiler (said once)."""
    if "bridge" in _state:
        return _state["bridge"]
    _state["bridge"] = None
    if os.environ.get(SWITCH_ENV, "1") == "0" or os.environ.get(LIBS_ENV):
        return None
    runtime = runtime or loaded_cudart()
    if runtime is None or jit_runtime_loaded():
        return None
    try:
        bridge = build_bridge(runtime)
        # The JIT resolves a kernel's runtime entries in the process's global scope before its own
        # list of libraries, so the first library there that defines them is the one it binds:
        # this one, loaded before CuTe DSL's (which its first compile loads).
        ctypes.CDLL(str(bridge), mode=os.RTLD_GLOBAL)
    except OSError as e:
        print(f"llmcompile: kernels launch through CuTe DSL's own CUDA runtime ({e})", file=sys.stderr)
        return None
    _state["bridge"] = bridge
    return bridge
