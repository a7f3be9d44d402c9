"""Where the host time of one eager call goes (GPU): each piece of the lean call path timed alone,
down to the floors under it (a TVM-FFI call that does nothing, a CuTe DSL kernel that does nothing,
torch's cheapest launch).

python -m evals.scripts.call_breakdown
"""

import sys
from typing import Any

import torch

from evals.scripts.host_overhead import interleaved_us, per_call_us
from llmcompile import kernels
from llmcompile.runtime import callpath, native_call


def empty_kernel(x: torch.Tensor) -> Any:
    """A CuTe DSL kernel with an empty body, compiled the way every kernel here is (TVM-FFI, the
    torch stream taken in C): its call is the floor of any kernel's call."""
    import cutlass
    import cutlass.cute as cute

    from llmcompile.specs.contract import ensure_arch

    ensure_arch()

    @cute.kernel
    def kernel(mX: cute.Tensor) -> None:
        pass

    @cute.jit
    def launch(mX: cute.Tensor, stream) -> None:  # noqa: ANN001
        kernel(mX).launch(grid=[1, 1, 1], block=[32, 1, 1], stream=stream)

    fake = cute.runtime.make_fake_compact_tensor(
        cutlass.BFloat16, (cute.sym_int(), x.shape[1]), stride_order=(1, 0), assumed_align=16
    )
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return cute.compile(launch, fake, stream, options="--enable-tvm-ffi")


def main() -> int:
    import tvm_ffi

    print(
        f"torch {torch.__version__}, apache-tvm-ffi {tvm_ffi.__version__}, "
        f"torch.Tensor.__dlpack_c_exchange_api__: {hasattr(torch.Tensor, '__dlpack_c_exchange_api__')}, "
        f"native_call: {native_call.available() or native_call.reason()}",
        flush=True,
    )
    x = torch.randn(8, 1024, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(x)
    fn = kernels.softmax
    fn(x)
    raw = fn.compiled("bfloat16", 1024)
    plan = fn._plans[(torch.bfloat16, 1024)]
    fast = fn._fast[(torch.bfloat16, 1024, 2)]
    py_fast = callpath._fast_function(plan)
    bare = callpath.bare_function(raw)
    nop = tvm_ffi.get_global_func("testing.nop")
    empty = empty_kernel(x)
    stream = torch.cuda.Stream()
    pieces = {
        "torch.softmax (eager)": lambda: torch.softmax(x, -1),
        "kernels.softmax(x)": lambda: fn(x),
        "KernelFunction.__call__(kernels.softmax, x) (entered in Python)": lambda: type(fn).__call__(fn, x),
        "compiled fn(x, out), outputs preallocated": lambda: raw(x, out),
        "plan.fn(x, out)": lambda: plan.fn(x, out),
        "the plan's fast function(x) (outputs made in C where native_call builds)": lambda: fast(x),
        "the plan's Python fast function(x) (torch.empty_like)": lambda: py_fast(x),
        "its tvm_ffi.Function(x, out), no Python wrapper": lambda: bare(x, out),
        "CuTe DSL empty kernel(x), TVM-FFI": lambda: empty(x),
        "TVM-FFI testing.nop()": lambda: nop(),
        "TVM-FFI testing.nop(x, out)": lambda: nop(x, out),
        "TVM-FFI testing.nop(1, 2)": lambda: nop(1, 2),
        "torch x.zero_() (one launch)": lambda: out.zero_(),
        "torch.cuda.current_stream()": torch.cuda.current_stream,
        "torch.empty((8, 1024))": lambda: torch.empty((8, 1024), dtype=torch.bfloat16, device=x.device),
        "torch.empty_like(x)": lambda: torch.empty_like(x),
        "x.view(8, 1024)": lambda: x.view(8, 1024),
        "torch.compiler.is_compiling()": torch.compiler.is_compiling,
        "x.is_contiguous() + data_ptr() + is_cuda": lambda: (x.is_contiguous(), x.data_ptr(), x.is_cuda),
        "x.device": lambda: x.device,
        "x.numel() + x.shape[-1] + x.dim()": lambda: (x.numel(), x.shape[-1], x.dim()),
    }
    for name, us in interleaved_us(pieces, 1000, 11).items():
        print(f"{us:8.2f} us  {name}", flush=True)
    with torch.cuda.stream(stream):
        print(f"{per_call_us(lambda: empty(x), 2000, 5):8.2f} us  CuTe DSL empty kernel(x), side stream", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
