"""The kernel that writes a candidate's inputs while letting it start early: the check of
dependent launches. Imported by the GPU worker only (it imports CuTe DSL).

A kernel launched as a programmatic dependent (`use_pdl`) may start while the kernel before it
on the stream is still running, once that one calls griddepcontrol.launch_dependents; it must
then execute griddepcontrol.wait before it reads anything that kernel writes. A candidate that
asks for the early start and skips the wait reads stale inputs whenever its producer releases
dependents early, which our own kernels and torch's do not, so no other check sees it. This
producer does: it releases its dependents at once, idles SPIN_NS, then copies the inputs into
place. A candidate that waits, or that launches plainly, reads what was copied; one that does
not wait reads the NaN the inputs held before.
"""

from typing import Any

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Int64

from llmcompile.specs import contract

THREADS = 256
CTAS = 528  # four a SM of an H100: room left beside them for a dependent that starts early
SPIN_NS = 200_000


@cute.kernel
def _produce(src: cute.Tensor, dst: cute.Tensor, spin_ns: Int64):
    cute.arch.griddepcontrol_launch_dependents()
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    start = cute.arch.globaltimer()
    now = start
    while now - start < spin_ns:
        now = cute.arch.globaltimer()
    for i in cutlass.range(bidx * THREADS + tidx, src.shape[0], CTAS * THREADS):
        dst[i] = src[i]


@cute.jit
def _launch(src: cute.Tensor, dst: cute.Tensor, spin_ns: Int64, stream):
    _produce(src, dst, spin_ns).launch(grid=[CTAS, 1, 1], block=[THREADS, 1, 1], stream=stream)


_COMPILED: dict[str, Any] = {}


def _compiled() -> Any:
    if "fn" not in _COMPILED:
        contract.ensure_arch()
        fake = cute.runtime.make_fake_compact_tensor(cutlass.Uint8, (cute.sym_int(),), assumed_align=16)
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        _COMPILED["fn"] = cute.compile(_launch, fake, fake, Int64(0), stream, options="--enable-tvm-ffi")
    return _COMPILED["fn"]


def produce(src: torch.Tensor, dst: torch.Tensor, spin_ns: int = SPIN_NS) -> None:
    """Copy src into dst (same bytes) on the current stream, releasing dependents first."""
    _compiled()(src.reshape(-1).view(torch.uint8), dst.reshape(-1).view(torch.uint8), spin_ns)
