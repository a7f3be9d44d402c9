"""Device memory a kernel can only read: where the verify stage puts a candidate's inputs.

Guard bands and a bit-for-bit comparison after the call see a write into an input only when it
is left behind. A kernel that parks scratch in its input and puts the old values back before it
returns leaves nothing to see, yet anything reading that input meanwhile (another stream, an
overlapped consumer) reads garbage. So the inputs are mapped through CUDA's virtual memory
management with read-only access for the device: such a write faults (cudaErrorIllegalAddress)
the moment it happens, whether or not it is undone later.

H100, 2026-11-26 (evals/results/judge/): creating and mapping 16-256 MB takes 0.1-0.2 ms, each
change of access 0.1 ms; a write into a read-only mapping faults with an illegal address.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


class ReadOnlyUnavailable(RuntimeError):
    """This process cannot map read-only device memory (no cuda-bindings, or a driver that refuses)."""


def _driver() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError as e:  # (torch's CUDA build and CuTe DSL both bring cuda-bindings)
        raise ReadOnlyUnavailable(f"cuda-bindings is not importable: {e}") from None
    return driver


def _check(result: Any, what: str) -> Any:
    """cuda-bindings returns (CUresult, *values): the values, or ReadOnlyUnavailable."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise ReadOnlyUnavailable(f"{what} failed: {err}")
    return values[0] if len(values) == 1 else values


class _Interface:
    """A raw device range as torch sees foreign memory (__cuda_array_interface__): bytes."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3}


@dataclass
class Mapping:
    """One VMM allocation: a physical chunk mapped at its own virtual range."""

    handle: Any
    ptr: int
    size: int
    device: int
    writable: bool = True

    def tensor(self, nbytes: int) -> torch.Tensor:
        """The first `nbytes` as a uint8 tensor that does not own the memory (keep the Mapping)."""
        return torch.as_tensor(_Interface(self.ptr, self.size), device=f"cuda:{self.device}")[:nbytes]

    def set_writable(self, writable: bool) -> None:
        """Change the device's access. Not stream-ordered: the caller synchronizes first, or a
        kernel still writing here faults."""
        if writable == self.writable:
            return
        cu = _driver()
        desc = cu.CUmemAccessDesc()
        desc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        desc.location.id = self.device
        flags = cu.CUmemAccess_flags
        desc.flags = flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE if writable else flags.CU_MEM_ACCESS_FLAGS_PROT_READ
        _check(cu.cuMemSetAccess(self.ptr, self.size, [desc], 1), "cuMemSetAccess")
        self.writable = writable

    def free(self) -> None:
        cu = _driver()
        _check(cu.cuMemUnmap(self.ptr, self.size), "cuMemUnmap")
        _check(cu.cuMemAddressFree(self.ptr, self.size), "cuMemAddressFree")
        _check(cu.cuMemRelease(self.handle), "cuMemRelease")

    def alias(self) -> Alias:
        """The same memory at a second address, writable there whatever this one's access: the
        judge's own writes, ordered on a stream between a candidate's calls that see it read-only
        (a host-side access change would synchronize between them)."""
        ptr = _map(_driver(), self.size, self.handle)
        alias = Alias(self, Mapping(self.handle, ptr, self.size, self.device, writable=False))
        try:
            alias.at.set_writable(True)
        except ReadOnlyUnavailable:
            alias.free()
            raise
        return alias


@dataclass
class Alias:
    """A second, writable mapping of `of`'s memory (`Mapping.alias`); `free` unmaps it only."""

    of: Mapping
    at: Mapping

    def view_of(self, t: torch.Tensor) -> torch.Tensor:
        """`t`, a contiguous tensor inside `of`, as the same bytes at the alias's address."""
        start, nbytes = t.data_ptr() - self.of.ptr, t.numel() * t.element_size()
        if not (0 <= start and start + nbytes <= self.of.size and t.is_contiguous()):
            raise ValueError("not a contiguous tensor inside the aliased mapping")
        return self.at.tensor(self.at.size)[start : start + nbytes].view(t.dtype).view(t.shape)

    def free(self) -> None:
        cu = _driver()
        _check(cu.cuMemUnmap(self.at.ptr, self.at.size), "cuMemUnmap")
        _check(cu.cuMemAddressFree(self.at.ptr, self.at.size), "cuMemAddressFree")


def _prop(cu: Any, device: int) -> Any:
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device
    return prop


def _create(cu: Any, size: int, prop: Any) -> Any:
    """The physical chunk. Memory torch's allocator caches but does not use is not ours to take
    until it lets go: on running out, it does, and the chunk is asked for once more (else a
    judge's own shortfall would read as the CUDA error of a candidate's call)."""
    oom = int(cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY)
    err, *handle = cu.cuMemCreate(size, prop, 0)
    if int(err) == oom:
        torch.cuda.empty_cache()
        err, *handle = cu.cuMemCreate(size, prop, 0)
    if int(err) == oom:
        raise torch.OutOfMemoryError(f"read-only device memory: cuMemCreate of {size} bytes ran out of memory")
    return _check((err, *handle), "cuMemCreate")


def _map(cu: Any, size: int, handle: Any) -> int:
    """A new virtual range of `size` bytes with the physical chunk `handle` mapped there (no access
    yet: `Mapping.set_writable`); the range given back where the mapping fails."""
    ptr = int(_check(cu.cuMemAddressReserve(size, 0, 0, 0), "cuMemAddressReserve"))
    try:
        _check(cu.cuMemMap(ptr, size, 0, handle, 0), "cuMemMap")
    except ReadOnlyUnavailable:
        cu.cuMemAddressFree(ptr, size)
        raise
    return ptr


def allocate(nbytes: int, device: int | None = None) -> Mapping:
    """A writable mapping of at least `nbytes` (rounded up to the allocation granularity, 2 MB
    on an H100); make it read-only with `set_writable(False)` once it is filled."""
    cu = _driver()
    torch.cuda.init()
    dev = torch.cuda.current_device() if device is None else device
    prop = _prop(cu, dev)
    gran = int(_check(cu.cuMemGetAllocationGranularity(prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity"))  # fmt: skip
    size = max(gran, -(-nbytes // gran) * gran)
    handle = _create(cu, size, prop)
    try:
        ptr = _map(cu, size, handle)
    except ReadOnlyUnavailable:
        cu.cuMemRelease(handle)
        raise
    m = Mapping(handle, ptr, size, dev, writable=False)
    m.set_writable(True)
    return m


_PROBED: dict[int, str] = {}


def unavailable_reason() -> str:
    """Why read-only inputs cannot be had in this process ("" when they can): probed once."""
    dev = torch.cuda.current_device()
    if dev not in _PROBED:
        try:
            m = allocate(1)
            m.set_writable(False)
            m.free()
            _PROBED[dev] = ""
        except ReadOnlyUnavailable as e:
            _PROBED[dev] = str(e)
    return _PROBED[dev]
