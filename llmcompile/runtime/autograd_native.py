"""The row ops' autograd nodes in C++ (`autograd_nodes.cpp`, a torch extension), built once per
machine and torch version with its C++ compiler into the llmcompile cache.

A Python `torch.autograd.Function` costs a training step what torch's C++ nodes do not: at 2 x 4 x
1024 bf16 on the H100 a softmax step took 1.24x torch's host time and an rmsnorm step 1.15x
(`evals/results/host-time`), most of it the backward, which the autograd engine runs through
Python. The nodes here are C++ and call the same kernel functions. Where the extension cannot be
built (no C++ compiler or no torch headers), `module()` is None, `reason()` says why, and
`runtime/autograd.py` keeps its Python Functions. They are also what torch.compile traces and
what functorch transforms see.

`runtime/autograd.py` takes these nodes only with LLMCOMPILE_NATIVE_AUTOGRAD=1 until they have run
on the H100 (`bash .ci/gpu backward` runs the gradient tests both ways, `bash .ci/gpu train` the
host times): they were built and tested on the CPU alone.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from llmcompile.runtime.native_call import library_path, load

SOURCE = Path(__file__).resolve().parent / "autograd_nodes.cpp"
MODULE = "llmcompile_autograd"
_failure: list[str] = []


def build(path: Path) -> None:
    """Compile autograd_nodes.cpp against this torch into `path` (written whole, then renamed)."""
    import torch
    from torch.utils import cpp_extension

    cxx = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    if cxx is None:
        raise OSError("no C++ compiler (c++ or g++ on PATH, or CXX)")
    python = Path(sysconfig.get_paths()["include"])
    if not (python / "Python.h").is_file():
        raise OSError(f"no Python.h in {python} (the Python development headers)")
    includes = [Path(p) for p in cpp_extension.include_paths()]
    if not (includes[0] / "torch" / "extension.h").is_file():
        raise OSError(f"no torch/extension.h under {includes[0]} (this torch has no C++ headers)")
    libs = cpp_extension.library_paths()
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        out = Path(tmp) / path.name
        cmd = [cxx, "-shared", "-fPIC", "-O2", "-std=c++17", f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
        cmd += [f"-DTORCH_EXTENSION_NAME={MODULE}", "-DTORCH_API_INCLUDE_EXTENSION_H"]
        cmd += [f"-I{p}" for p in (*includes, python)]
        cmd += ["-o", str(out), str(SOURCE)]
        cmd += [f"-L{p}" for p in libs] + [f"-Wl,-rpath,{p}" for p in libs]
        cmd += ["-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise OSError(f"c++ failed: {(done.stderr or done.stdout)[-800:]}")
        os.replace(out, path)


@functools.cache
def module() -> Any:
    """The extension with every op's kernel functions registered, or None (`reason()` says why)."""
    try:
        import torch

        path = library_path(SOURCE, MODULE, torch.__version__)
        if not path.is_file():
            build(path)
        ext = load(path, MODULE)
    except Exception as e:  # any failure means the Python Functions, never a failed call
        _failure.append(f"{type(e).__name__}: {e}")
        return None
    from llmcompile.runtime import compiled as kernels

    ext.register_op(ext.SOFTMAX, kernels.softmax, kernels.softmax_bwd)
    ext.register_op(ext.LOG_SOFTMAX, kernels.log_softmax, kernels.log_softmax_bwd)
    ext.register_op(ext.RMSNORM, kernels.rmsnorm_fwd, kernels.rmsnorm_bwd)
    ext.register_op(ext.LAYERNORM, kernels.layernorm_fwd, kernels.layernorm_bwd)
    return ext


def reason() -> str | None:
    """Why the C++ nodes are not available here (None where they are, or were not tried yet)."""
    return _failure[0] if _failure else None
