"""The memory a candidate's calls touch, laid so that a wrong touch shows: tensors between guard
bands, read-only device memory made writable only for the judge's own loads, the judge's own copy
of the inputs out of a kernel's reach, fingerprints of an input's bits, and the test that tells a
device fault (the candidate's) from the judge's own errors."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from llmcompile.harness import readonly, verify

GUARD_BYTES = 4096
INT_GUARD = 1 << 40  # an index no row has: reading it as a target gives nonsense, not a pass


class CandidateFault(Exception):
    """The candidate broke the CUDA context (illegal address, trap): the worker must go."""


@contextmanager
def access(mappings: list[readonly.Mapping], writable: bool) -> Iterator[None]:
    """`mappings` writable (or read-only) for the block, back after it (access changes are not
    stream-ordered: synchronised around). A block that raises a device fault leaves them to
    `release`: after a fault, the context may take no further calls."""

    def flip(to: bool) -> None:
        if mappings:
            sync()
        for m in mappings:
            m.set_writable(to)

    flip(writable)
    try:
        yield
    except BaseException as e:
        if not device_fault(e):
            flip(not writable)
        raise
    flip(not writable)


def writable(mappings: list[readonly.Mapping]) -> AbstractContextManager[None]:
    """Read-only `mappings` made writable for the block (the judge's own loads)."""
    return access(mappings, True)


def freed(mapping: readonly.Mapping | None) -> None:
    """Free `mapping` once the GPU is done with it (None: nothing to free); None, to assign."""
    if mapping is not None:
        sync()
        mapping.free()


@dataclass
class Guarded:
    """A tensor between two guard bands; in read-only device memory when `mapping` is set."""

    name: str
    view: torch.Tensor
    buf: torch.Tensor
    g: int  # guard elements on each side
    guard: torch.Tensor  # the bytes of one band as allocated
    mapping: readonly.Mapping | None = None

    def guards_intact(self) -> bool:
        b = self.buf.view(torch.uint8)
        gb = self.g * self.buf.element_size()
        return torch.equal(b[:gb], self.guard) and torch.equal(b[-gb:], self.guard)

    def load(self, x: torch.Tensor) -> None:
        """Copy `x` in; a read-only one is made writable for the copy and read-only again."""
        with writable([self.mapping] if self.mapping is not None else []):
            self.view.copy_(x)

    def release(self) -> None:
        self.mapping = freed(self.mapping)


@dataclass
class JudgeCopy:
    """The judge's own copy of a case's inputs, which the guarded inputs are loaded from and the
    answer is checked against: a candidate must not change it during its call. Read-only device
    memory where the device has it (no call moves it: on the host, KernelBench 45's 3.2 GB input
    took 2.3 s to copy there, 0.4 s back per check, 5.4 s to nudge; H200); else pageable host
    memory, which these GPUs' kernels cannot address (no pageable memory access)."""

    tensors: list[torch.Tensor]
    mappings: list[readonly.Mapping] = field(default_factory=list)

    def load(self, xs: list[torch.Tensor]) -> None:
        with writable(self.mappings):
            for t, x in zip(self.tensors, xs):
                t.copy_(x)

    def nudge(self, seed: int, move: float = 1.0) -> Callable[[], None]:
        """One element in every 1024 of the first floating input (and at least one) moved by
        `move`, in place: an answer cached by a sample of the input shows. Returns what puts them
        back."""
        x = next((t for t in self.tensors if t.is_floating_point() and t.numel()), None)
        if x is None:
            return lambda: None
        flat = x.view(-1)
        gen = torch.Generator(device=x.device).manual_seed(seed)
        where = torch.randint(0, flat.numel(), (max(1, flat.numel() // 1024),), generator=gen, device=x.device)
        old = flat[where].clone()
        with writable(self.mappings):
            flat[where] = (old.double() + move).to(x.dtype)

        def back() -> None:
            with writable(self.mappings):
                flat[where] = old

        return back

    def release(self) -> None:
        if self.mappings:
            sync()
        for m in self.mappings:
            m.free()
        self.mappings = []


def judge_copy(xs: list[torch.Tensor], on_device: bool) -> JudgeCopy:
    """A JudgeCopy of `xs`: on the device (read-only) or on the host."""
    if not on_device:
        return JudgeCopy([x.to("cpu", copy=True) for x in xs])
    copy = JudgeCopy([])
    try:
        for x in xs:
            nbytes = x.numel() * x.element_size()
            copy.mappings.append(readonly.allocate(max(1, nbytes), x.device.index))
            copy.tensors.append(copy.mappings[-1].tensor(nbytes).view(x.dtype).view(x.shape))
        copy.load(xs)
    except BaseException:
        copy.release()
        raise
    return copy


def slab_bytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    """Bytes a guarded tensor takes, its bands included, rounded up to the 512 bytes torch aligns
    allocations to (so slabs laid end to end keep every view aligned as its own allocation would)."""
    esize = torch.empty((), dtype=dtype).element_size()
    raw = (torch.Size(shape).numel() + 2 * (GUARD_BYTES // esize)) * esize
    return -(-raw // 512) * 512


def guarded(
    name: str,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: str = "cuda",
    read_only: bool = False,
    within: torch.Tensor | None = None,
) -> Guarded:
    """`within`: uint8 memory of `slab_bytes` to lay the tensor in (its owner frees it), in place
    of an allocation of its own (a read-only mapping of its own where `read_only`)."""
    numel = torch.Size(shape).numel()
    esize = torch.empty((), dtype=dtype).element_size()
    g = GUARD_BYTES // esize  # keeps the view 16-byte aligned: allocations are 512-aligned
    mapping = None
    try:
        if within is not None:
            buf = within[: (numel + 2 * g) * esize].view(dtype)
        elif read_only:
            mapping = readonly.allocate((numel + 2 * g) * esize)
            buf = mapping.tensor((numel + 2 * g) * esize).view(dtype)
        else:
            buf = torch.empty(numel + 2 * g, dtype=dtype, device=device)
        buf.fill_(float("nan") if dtype.is_floating_point else INT_GUARD)
        guard = buf.view(torch.uint8)[: g * esize].clone()
    except BaseException:
        if mapping is not None:
            mapping.free()
        raise
    return Guarded(name, buf[g : g + numel].view(shape), buf, g, guard, mapping)


def device_fault(e: BaseException) -> bool:
    """Whether an exception is a fault a kernel can raise on the device (an illegal address, a
    trap: whatever the CUDA runtime reports). Running out of memory is not one: a kernel
    allocates nothing, so that is the judge's memory plan falling short."""
    text = f"{type(e).__name__} {e}"
    if "OutOfMemory" in text or "out of memory" in text:
        return False
    return isinstance(e, CandidateFault) or any(w in text for w in ("CUDA", "cuda", "illegal"))


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    # (flat first: a 0-dim tensor, a loss, has no byte view of its own)
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)) if a.numel() else True


def poison_workspace(fn: Any) -> None:
    """NaN into a kernel's scratch workspace (contract rule 6: undefined on entry), so a kernel
    that keeps state there between calls shows."""
    verify.poison(list(getattr(fn, "buffers", {}).values()))


def guard_workspace(fn: Any, device: torch.device) -> list[Guarded]:
    """The kernel's scratch workspace on `device` laid between guard bands (the runtime's own
    allocation has none: a write past it would land unseen in whatever torch put next to it);
    [] for a kernel without one. Its bands are checked as an output's are."""
    elems = getattr(fn, "elems", 0)
    if not elems or not isinstance(getattr(fn, "buffers", None), dict):
        return []
    ws = guarded("workspace", (elems,), torch.float32, str(device))
    fn.buffers[device] = ws.view
    return [ws]


def broken_guard(tensors: list[Guarded]) -> str | None:
    """The name of the first tensor whose guard bands changed."""
    return next((t.name for t in tensors if not t.guards_intact()), None)


# The weighted fingerprint's period: a prime, so a rotation or swap of elements changes it.
_FP_PERIOD = 65521
_FP_CHUNK = 1 << 24


def fingerprint(t: torch.Tensor) -> tuple[int, int]:
    """Two checksums of a tensor's bits (their sum, and their sum weighted by position), computed
    on the device, in chunks: an input changed during the timed calls changes them. Host ints,
    out of any kernel's reach."""
    flat = t.reshape(-1)
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[flat.element_size()]
    bits = flat.view(ints)
    total = torch.zeros((), dtype=torch.int64, device=t.device)
    weighted = torch.zeros((), dtype=torch.int64, device=t.device)
    w = torch.arange(min(_FP_CHUNK, bits.numel()), device=t.device, dtype=torch.int64) % _FP_PERIOD + 1
    for lo in range(0, bits.numel(), _FP_CHUNK):
        c = bits[lo : lo + _FP_CHUNK].to(torch.int64)
        total += c.sum()
        weighted += (c * w[: c.numel()]).sum()
    return int(total), int(weighted)
