"""The row ops' autograd nodes in C++ (`autograd_nodes.cpp`, a torch extension), and the fused
cross-entropy loss's and the attention's, built once per machine and torch version with its C++ compiler into the
llmcompile cache.

A Python `torch.autograd.Function` costs a training step what torch's C++ nodes do not: its
forward's `Function.apply` and its backward, which the autograd engine runs through Python. The
nodes here are C++ and call the same kernel functions. Where the extension cannot be built (no
C++ compiler or no torch headers), `module()` is None, `reason()` says why, and
`runtime/autograd.py` keeps its Python Functions. They are also what torch.compile traces and
what functorch transforms see.

`runtime/autograd.py` takes these nodes unless LLMCOMPILE_NATIVE_AUTOGRAD=0, and routes the public
kernel functions' grad calls to them from C (`grad_call`). A backward launches the kernel its
forward found planned without the GIL (`set_native`, native_call's `native_api`). On the H100 the
gradient tests passed through them; a small training step took 0.96x (softmax) and 0.86x
(rmsnorm) torch's host time (`evals/results/host-time/`; `bash .ci/gpu backward` runs the
gradient tests both ways, `bash .ci/gpu train` the host times).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

from llmcompile.runtime.native_call import compile_into, compiler, library_path, load, native_api, python_include

SOURCE = Path(__file__).resolve().parent / "autograd_nodes.cpp"
MODULE = "llmcompile_autograd"
_failure: list[str] = []


def build(path: Path) -> None:
    """Compile autograd_nodes.cpp against this torch into `path`."""
    import torch
    from torch.utils import cpp_extension

    cxx = compiler("CXX", ("c++", "g++"), "C++ compiler")
    python = python_include()
    includes = [Path(p) for p in cpp_extension.include_paths()]
    if not (includes[0] / "torch" / "extension.h").is_file():
        raise OSError(f"no torch/extension.h under {includes[0]} (this torch has no C++ headers)")
    libs = cpp_extension.library_paths()
    flags = ["-std=c++17", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
    flags += [f"-DTORCH_EXTENSION_NAME={MODULE}", "-DTORCH_API_INCLUDE_EXTENSION_H"]
    flags += [f"-I{p}" for p in (*includes, python)]
    link = [f"-L{p}" for p in libs] + [f"-Wl,-rpath,{p}" for p in libs]
    compile_into(path, cxx, flags, SOURCE, [*link, "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"])


@functools.cache
def module() -> Any:
    """The extension with every op's kernel functions registered, or None (`reason()` says why)."""
    try:
        import torch

        path = library_path(SOURCE, MODULE, torch.__version__)
        if not path.is_file():
            print("llmcompile: building the C++ autograd nodes for this torch (once, about 30 s)", file=sys.stderr)
            build(path)
        ext = load(path, MODULE)
    except Exception as e:  # any failure means the Python Functions, never a failed call
        _failure.append(f"{type(e).__name__}: {e}")
        return None
    register_kernels(ext)
    return ext


def register_kernels(ext: Any) -> None:
    """Give the extension's nodes the kernel functions (and a norm's eps defaults), and the guards
    that send a call back to the Python Functions."""
    import torch

    from llmcompile.runtime import attention_backward
    from llmcompile.runtime import compiled as kernels
    from llmcompile.specs import BUILTIN

    def eps(op: str) -> dict[str, float]:  # a call's default eps, and its forward kernel's own
        return {"eps": float(BUILTIN[op].scalars["eps"]), "kernel_eps": float(BUILTIN[f"{op}_fwd"].scalars["eps"])}

    ext.register_op(ext.SOFTMAX, kernels.softmax, kernels.softmax_bwd, kernels.softmax_bwd_scalar)
    ext.register_op(ext.LOG_SOFTMAX, kernels.log_softmax, kernels.log_softmax_bwd, kernels.log_softmax_bwd_scalar)
    ext.register_op(ext.RMSNORM, kernels.rmsnorm_fwd, kernels.rmsnorm_bwd, kernels.rmsnorm_bwd_scalar, **eps("rmsnorm"))
    ext.register_op(
        ext.LAYERNORM, kernels.layernorm_fwd, kernels.layernorm_bwd, kernels.layernorm_bwd_scalar, **eps("layernorm")
    )
    ext.register_op(ext.CE_LOSS, kernels.cross_entropy_fused_total, kernels.scale_)  # (in place, on dx)
    ext.register_op(ext.CE_TOTAL, kernels.cross_entropy_total, None)  # (no gradient wanted: no backward)
    ext.set_attention(attention_backward.route, attention_backward.backward)  # (the kernel comes with each call)
    for slot, fn in enumerate(kernels.ATTENTIONS):  # (their C calls' route: grad_call's op ATTENTION + slot)
        ext.register_attention(slot, fn, *kernels.attention_flags(fn))
    ext.set_native(native_api())  # (a backward then launches its planned kernel without the GIL)
    # what tells grad_call that torch.compile traces (functorch it asks in C++): those calls go back to
    # the Python Functions, as autograd.py's _nodes sends them
    ext.set_guards(torch.compiler)


def reason() -> str | None:
    """Why the C++ nodes are not available here (None where they are, or were not tried yet)."""
    return _failure[0] if _failure else None
