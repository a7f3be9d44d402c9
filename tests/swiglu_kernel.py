"""An elementwise SwiGLU kernel for the KernelBench problem evals/problems/swiglu.py (used by tests)."""

import cutlass
import cutlass.cute as cute
from cutlass import Float32

THREADS = 256


@cute.kernel
def swiglu_kernel(mG: cute.Tensor, mU: cute.Tensor, mO: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    row, _, _ = cute.arch.block_idx()
    for c in cutlass.range(tidx, mG.shape[1], THREADS):
        g = Float32(mG[row, c])
        sig = cute.arch.rcp_approx(1.0 + cute.math.exp(-g, fastmath=True))
        mO[row, c] = (g * sig * Float32(mU[row, c])).to(mO.element_type)


@cute.jit
def launch(mG: cute.Tensor, mU: cute.Tensor, mO: cute.Tensor, stream):
    swiglu_kernel(mG, mU, mO).launch(grid=[mG.shape[0], 1, 1], block=[THREADS, 1, 1], stream=stream)
