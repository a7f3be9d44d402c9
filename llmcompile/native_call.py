"""The eager call with its outputs allocated in C (`native_call.c`), built once per machine.

`make_caller(fn, n_in, outs, values, bound)` wraps a kernel's TVM-FFI function into one that
takes the inputs only and returns the outputs as torch tensors, allocated by torch's caching
allocator from C. Where no C compiler or TVM-FFI header is at hand the build fails once, `reason()` says
why, and callers keep allocating from Python.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).resolve().parent / "native_call.c"
_failure: list[str] = []


DIMS = ("all", "first", "last")


@dataclass(frozen=True)
class OutputSpec:
    """Output i of a call: the shape of input `src`, all its dims or only its first (a value per
    row) or last (a value per column), and `dtype`."""

    src: int
    dims: str  # one of DIMS
    dtype: str  # a torch dtype's name: "bfloat16", "float32", "int64", ...


def cache_dir() -> Path:
    return Path(os.environ.get("LLMCOMPILE_CACHE", Path.home() / ".cache" / "llmcompile"))


def _library_path() -> Path:
    import tvm_ffi

    key = hashlib.sha256(
        SOURCE.read_bytes() + tvm_ffi.__version__.encode() + str(sysconfig.get_platform()).encode()
    ).hexdigest()[:16]
    return cache_dir() / f"native_call-{key}.so"


def build(path: Path) -> None:
    """Compile native_call.c into `path` (written whole, then renamed: concurrent builds agree)."""
    import tvm_ffi.libinfo

    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        raise OSError("no C compiler (cc or gcc on PATH, or CC)")
    lib = Path(tvm_ffi.libinfo.find_libtvm_ffi())
    include = Path(tvm_ffi.libinfo.find_include_path())
    dlpack = Path(tvm_ffi.libinfo.find_dlpack_include_path())
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        out = Path(tmp) / path.name
        cmd = [cc, "-shared", "-fPIC", "-O2", "-std=c11", f"-I{include}", f"-I{dlpack}", "-o", str(out), str(SOURCE)]
        cmd += [str(lib), f"-Wl,-rpath,{lib.parent}"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise OSError(f"cc failed: {(done.stderr or done.stdout)[-800:]}")
        os.replace(out, path)


@functools.cache
def _make_caller() -> Any:
    """TVM-FFI's handle on `llmcompile_make_caller`, or None (the reason kept for `reason()`)."""
    try:
        import tvm_ffi

        path = _library_path()
        if not path.is_file():
            build(path)
        return tvm_ffi.load_module(str(path)).get_function("llmcompile_make_caller")
    except Exception as e:  # any failure means the Python allocation path, never a failed call
        _failure.append(f"{type(e).__name__}: {e}")
        return None


def is_function(fn: Any) -> bool:
    """A TVM-FFI function (what a compiled kernel is), not any Python callable."""
    try:
        import tvm_ffi
    except ImportError:
        return False
    return isinstance(fn, tvm_ffi.Function)


def available() -> bool:
    return _make_caller() is not None


def reason() -> str | None:
    """Why the C call is not available here (None where it is, or was not tried yet)."""
    return _failure[0] if _failure else None


def make_caller(
    fn: Any, n_in: int, outs: list[OutputSpec], values: tuple[float | int, ...] = (), bound: tuple[Any, ...] = ()
) -> Any:
    """`fn(*inputs, *outputs, *bound, *values)` as `caller(*inputs) -> output | Array of outputs`;
    `bound` tensors (a workspace) are held by the caller for its lifetime."""
    import tvm_ffi

    make = _make_caller()
    if make is None:
        raise OSError(f"the C call is not available: {reason()}")
    specs: list[int] = []
    for o in outs:
        dt = tvm_ffi.dtype(o.dtype)
        specs += [o.src, DIMS.index(o.dims), dt.type_code, dt.bits]
    return make(fn, n_in, len(outs), *specs, len(bound), *bound, len(values), *values)
