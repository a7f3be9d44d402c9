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

The copy goes in the widest word (8, 4, 2 or 1 bytes) that both tensors' addresses and the byte
count allow, indexed in 64 bits: a problem's input may hold more than 2^31 bytes (KernelBench 100's
predictions are 4 GiB), and a byte at a time would cost such an input seconds.
"""

from typing import Any

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Int16, Int32, Int64, Uint8

from llmcompile.specs import contract

THREADS = 256
CTAS = 528  # four a SM of an H100: room left beside them for a dependent that starts early
SPIN_NS = 200_000
# (bytes, CuTe DSL type, torch dtype of the same width): the copy's word, widest first
WORDS = ((8, Int64, torch.int64), (4, Int32, torch.int32), (2, Int16, torch.int16), (1, Uint8, torch.uint8))


@cute.kernel
def _produce(src: cute.Tensor, dst: cute.Tensor, spin_ns: Int64):
    cute.arch.griddepcontrol_launch_dependents()
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    start = cute.arch.globaltimer()
    now = start
    while now - start < spin_ns:
        now = cute.arch.globaltimer()
    for i in cutlass.range(Int64(bidx) * THREADS + tidx, src.shape[0], CTAS * THREADS):
        dst[i] = src[i]


@cute.jit
def _launch(src: cute.Tensor, dst: cute.Tensor, spin_ns: Int64, stream):
    _produce(src, dst, spin_ns).launch(grid=[CTAS, 1, 1], block=[THREADS, 1, 1], stream=stream)


_COMPILED: dict[int, Any] = {}


def _compiled(width: int) -> Any:
    if width not in _COMPILED:
        contract.ensure_arch()
        word = next(w for b, w, _ in WORDS if b == width)
        fake = cute.runtime.make_fake_compact_tensor(word, (cute.sym_int(width=64),), assumed_align=width)
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        _COMPILED[width] = cute.compile(_launch, fake, fake, Int64(0), stream, options="--enable-tvm-ffi")
    return _COMPILED[width]


def word_of(src: torch.Tensor, dst: torch.Tensor) -> tuple[int, torch.dtype]:
    """The widest word both tensors' addresses and their byte count are multiples of."""
    nbytes = src.numel() * src.element_size()
    for width, _, dtype in WORDS:
        if nbytes % width == 0 and src.data_ptr() % width == 0 and dst.data_ptr() % width == 0:
            return width, dtype
    raise AssertionError("a one-byte word always fits")


def produce(src: torch.Tensor, dst: torch.Tensor, spin_ns: int = SPIN_NS) -> None:
    """Copy src into dst (same bytes, both contiguous) on the current stream, releasing dependents first."""
    width, dtype = word_of(src, dst)
    flat = (src.reshape(-1).view(torch.uint8).view(dtype), dst.reshape(-1).view(torch.uint8).view(dtype))
    _compiled(width)(*flat, spin_ns)
