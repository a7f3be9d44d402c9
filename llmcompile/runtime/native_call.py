"""The eager call of a compiled kernel in C (`native_call.c`, a CPython extension), built once per
machine with its C compiler.

`make_caller(fn, n_in, outs, values, bound)` wraps a kernel's TVM-FFI function into a `Caller`
that takes the inputs only and returns the outputs as torch tensors, allocated by torch's caching
allocator from C. `entry_base()` is the base class of callpath's KernelFunction and `install(cls)`
makes a call of its instances start in C. Where no C compiler, Python header or TVM-FFI is at hand
the build fails once, `reason()` says why, and callers keep to Python: `entry_base()` is then a
plain class and `install` does nothing.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).resolve().parent / "native_call.c"
MODULE = "llmcompile_native"  # PyInit_llmcompile_native in the C file
_failure: list[str] = []


DIMS = (
    "all",
    "first",
    "last",
    "one",
    "lead",
)  # "one": a single value (1,), a total; "lead": src's shape less its last dim
# how an input's leading dims reach the kernel: as they are; rows (..., N) as (M, N); a value a row (...) as (M,)
FLAT = ("none", "rows", "values")


@dataclass(frozen=True)
class OutputSpec:
    """Output i of a call: the shape of input `src`, all its dims or only its first (a value per
    row) or last (a value per column), or one value (a total, shape (1,)), or all but its last
    (attention's lse: a value per query), and `dtype`."""

    src: int
    dims: str  # one of DIMS
    dtype: str  # a torch dtype's name: "bfloat16", "float32", "int64", ...


class _PythonEntry:
    """The base of a kernel function class where the C extension is not built: calls stay in Python."""


def cache_dir() -> Path:
    return Path(os.environ.get("LLMCOMPILE_CACHE", Path.home() / ".cache" / "llmcompile"))


def library_path(source: Path, module: str, version: str) -> Path:
    """Where an extension built from `source` against `version` (of what it links) is cached: a
    new source, version, platform or interpreter ABI is a new file."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]  # the interpreter's ABI, e.g. .cpython-312-x86_64-linux-gnu.so
    header = (source.parent / "native_api.h").read_bytes()  # (both extensions include it)
    key = hashlib.sha256(
        source.read_bytes() + header + version.encode() + sysconfig.get_platform().encode() + suffix.encode()
    ).hexdigest()[:16]
    return cache_dir() / f"{module}-{key}{suffix}"


def _library_path() -> Path:
    import tvm_ffi

    return library_path(SOURCE, MODULE, tvm_ffi.__version__)


def compiler(env: str, names: tuple[str, ...], what: str) -> str:
    """The compiler to build an extension with: $`env`, else the first of `names` on PATH."""
    found = shutil.which(os.environ.get(env, names[0])) or next(filter(None, map(shutil.which, names[1:])), None)
    if found is None:
        raise OSError(f"no {what} ({' or '.join(names)} on PATH, or {env})")
    return found


def python_include() -> Path:
    """The Python headers' directory, which every extension includes."""
    python = Path(sysconfig.get_paths()["include"])
    if not (python / "Python.h").is_file():
        raise OSError(f"no Python.h in {python} (the Python development headers)")
    return python


def compile_into(path: Path, cc: str, flags: list[str], source: Path, link: list[str]) -> None:
    """`source` built as a shared library into `path`, written whole then renamed (concurrent
    builds agree); OSError with the compiler's last words where it fails."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        out = Path(tmp) / path.name
        cmd = [cc, "-shared", "-fPIC", "-O2", *flags, "-o", str(out), str(source), *link]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise OSError(f"{Path(cc).name} failed: {(done.stderr or done.stdout)[-800:]}")
        os.replace(out, path)


def build(path: Path) -> None:
    """Compile native_call.c into `path`."""
    import tvm_ffi.libinfo

    cc = compiler("CC", ("cc", "gcc"), "C compiler")
    includes = (python_include(), tvm_ffi.libinfo.find_include_path(), tvm_ffi.libinfo.find_dlpack_include_path())
    lib = Path(tvm_ffi.libinfo.find_libtvm_ffi())
    compile_into(path, cc, ["-std=c11", *(f"-I{p}" for p in includes)], SOURCE, [str(lib), f"-Wl,-rpath,{lib.parent}"])


def load(path: Path, name: str = MODULE) -> Any:
    """The extension module `name` at `path`."""
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    if spec is None:
        raise OSError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@functools.cache
def _module() -> Any:
    """The extension, or None (the reason kept for `reason()`)."""
    try:
        path = _library_path()
        if not path.is_file():
            build(path)
        return load(path)
    except Exception as e:  # any failure means the Python call path, never a failed call
        _failure.append(f"{type(e).__name__}: {e}")
        return None


def is_function(fn: Any) -> bool:
    """A TVM-FFI function (what a compiled kernel is), not any Python callable."""
    try:
        import tvm_ffi
    except ImportError:
        return False
    return isinstance(fn, tvm_ffi.Function)


def is_caller(fn: Any) -> bool:
    """A call made by `make_caller` (what `Entry`'s C call runs)."""
    module = _module()
    return module is not None and isinstance(fn, module.Caller)


def available() -> bool:
    return _module() is not None


def reason() -> str | None:
    """Why the C call is not available here (None where it is, or was not tried yet)."""
    return _failure[0] if _failure else None


def entry_base() -> type:
    """The base class of a kernel function: the C `Entry` where the extension is built."""
    module = _module()
    return _PythonEntry if module is None else module.Entry


def install(cls: type) -> None:
    """Calls of `cls` instances start in C (where `cls` derives from the C `Entry`); `cls.__call__`
    stays the Python function that takes what the C call does not, and what torch.compile traces."""
    module = _module()
    if module is not None and issubclass(cls, module.Entry):
        import torch

        module.install(cls, torch.is_grad_enabled)


def register(entry: Any, dtype: str, n: int, ndim: int, caller: Any) -> bool:
    """Calls of `entry` (an `Entry`) on an x of `dtype`, `ndim` dims and last dim `n` run `caller`
    in C; False where its table is full (such calls keep to the Python call)."""
    import tvm_ffi

    dt = tvm_ffi.dtype(dtype)
    return bool(entry._set_call(dt.type_code, dt.bits, ndim, n, caller))


def set_node(entry: Any, grad_call: Any, op: int, ndim: int = 0) -> None:
    """Calls of `entry` that want grad go from its C call to `grad_call` (autograd_nodes.cpp's
    capsule) for op number `op`; None sends them back to its Python call. `ndim`: so do calls
    without grad on an x of that many dims (the attention's on SDPA's 4-D tensors). Nothing where
    the C call is not built (a Python entry's own call takes them)."""
    if hasattr(entry, "_set_node"):
        entry._set_node(grad_call, op, ndim)


def native_api() -> Any:
    """The capsule of the C call's entry points for C++ (native_api.h: a planned Caller run without
    the GIL, as an autograd node's backward runs it), or None where the C call is not built."""
    module = _module()
    return None if module is None else module.native_api


def _required() -> Any:
    """The extension, or OSError saying why it is not here."""
    module = _module()
    if module is None:
        raise OSError(f"the C call is not available: {reason()}")
    return module


def set_strided(caller: Any, strided: Any) -> None:
    """Calls of `caller` on a slice of wider rows (x's row stride not N, every row 16-byte aligned)
    run `strided`: the same call made for the kernel compiled for such rows."""
    _required().set_strided(caller, strided)


def set_alternate(caller: Any, other: Any) -> None:
    """Calls of `caller` with an input of another dtype than it was made for (`in_dtypes`) run
    `other`: the same op's call made for those dtypes (fp32 weights beside 16-bit rows)."""
    _required().set_alternate(caller, other)


def make_caller(
    fn: Any,
    n_in: int,
    outs: list[OutputSpec],
    values: tuple[float | int, ...] = (),
    bound: tuple[Any, ...] = (),
    flat: tuple[str, ...] | None = None,
    in_dtypes: tuple[str | None, ...] | None = None,
) -> Any:
    """`fn(*inputs, *outputs, *bound, *values)` as `caller(*inputs) -> output | list of outputs`;
    `bound` tensors (a workspace) are held by the caller for its lifetime. `flat` (one of FLAT an
    input): inputs whose leading dims the kernel sees as one M, as a view; outputs made like x
    then come back in x's shape (a value a row: in its leading dims' shape). `in_dtypes` (a torch
    dtype's name or None an input): an input of another dtype is refused in C, before the
    kernel's own check, or taken by the alternate call (`set_alternate`)."""
    import tvm_ffi

    module = _required()
    if not is_function(fn):
        raise TypeError(f"make_caller: fn must be a TVM-FFI function, got {type(fn).__name__}")
    specs = []
    for o in outs:
        dt = tvm_ffi.dtype(o.dtype)
        specs.append((o.src, DIMS.index(o.dims), dt.type_code, dt.bits))
    kinds = tuple(FLAT.index(k) for k in flat) if flat is not None else (0,) * n_in
    dts = tuple(
        None if d is None else (tvm_ffi.dtype(d).type_code, tvm_ffi.dtype(d).bits) for d in in_dtypes or (None,) * n_in
    )
    return module.make_caller(fn, n_in, tuple(specs), tuple(values), tuple(bound), kinds, dts)
