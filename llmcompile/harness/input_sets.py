"""The profile's input sets: enough random sets to keep L2 cold, each tensor between guard bands,
fingerprinted when made, all in one mapping the candidate sees read-only while it is timed; kept by
the worker across candidates of one problem while memory allows."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

import torch

from llmcompile.bench import timing
from llmcompile.harness import readonly
from llmcompile.harness.guards import Guarded, access, device_fault, fingerprint, freed, guarded, slab_bytes, sync
from llmcompile.specs import OpSpec

MIN_TIMED_SETS = 2  # input sets the timed calls rotate over at least: outputs rotate against them


@dataclass
class InputSets:
    """The timed calls' input sets, each tensor between NaN guard bands, fingerprinted when made
    (kept by the worker across candidates while memory allows: `cached_sets`). All of them in one
    mapping (`mapping`; None where read-only device memory is unavailable, or on the CPU), which
    `read_only` makes read-only while the candidate is timed: a write into an input faults there,
    even one put back before the kernel returns, which fingerprints cannot see. One mapping for
    all the sets, not one a tensor: a tiny shape has up to 64 sets of a few tensors each (enough
    to keep L2 cold), and each mapping is a 2 MB granule at least."""

    guarded: list[list[Guarded]]
    prints: list[list[tuple[int, int]]]
    mapping: readonly.Mapping | None = None

    @property
    def views(self) -> list[list[torch.Tensor]]:
        return [[g_.view for g_ in s] for s in self.guarded]

    def nbytes(self) -> int:
        return sum(g_.buf.numel() * g_.buf.element_size() for s in self.guarded for g_ in s)

    def tampered(self) -> str | None:
        """Which input changed since the sets were made (its guard bands or its bits), if any."""
        for k, (s, prints) in enumerate(zip(self.guarded, self.prints)):
            for g_, p in zip(s, prints):
                if not g_.guards_intact():
                    return f"the guard band of input `{g_.name}` (set {k}) changed: a write past its edge"
                if fingerprint(g_.view) != p:
                    return f"input `{g_.name}` (set {k}) changed during the timed calls"
        return None

    def read_only(self) -> AbstractContextManager[None]:
        """The sets read-only for the block (the candidate's timing), writable after it for the
        judge's own code (baselines, checks). A block that raises a device fault leaves them:
        the context takes no further calls, and the worker ends."""
        return access([self.mapping] if self.mapping is not None else [], False)

    @contextmanager
    def writable_alias(self) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        """For the block, each input tensor as the judge may write it in stream order while the
        candidate sees it read-only: the same bytes at a second, writable address
        (`readonly.Alias`); the tensor itself where there is no mapping. Unmapped after the block
        (which synchronizes first, `gpu_stages._candidates_turn`)."""
        if self.mapping is None:
            yield lambda t: t
            return
        alias = self.mapping.alias()
        try:
            yield alias.view_of
        except BaseException as e:
            if not device_fault(e):  # (after a fault the context takes no more calls: the worker ends)
                sync()
                alias.free()
            raise
        sync()
        alias.free()

    def release(self) -> None:
        """Free the mapping (the views into it must not be used after)."""
        self.mapping = freed(self.mapping)


def make_sets(
    spec: OpSpec, m: int, n: int, dtype: str, seed: int = 0, count: int | None = None, device: str = "cuda"
) -> InputSets:
    """Enough random input sets to keep L2 cold (and at least MIN_TIMED_SETS), made on the GPU,
    in one read-only-capable mapping where the device has them."""
    if count is None:
        count = max(MIN_TIMED_SETS, timing.rotation_count(spec.bytes_moved(m, n, dtype)))
    gen = torch.Generator(device=device).manual_seed(seed)
    made = spec.make_inputs(m, n, dtype, gen, "random", device)
    slabs = [slab_bytes(tuple(x.shape), x.dtype) for x in made]
    sets = InputSets([], [])
    if device != "cpu" and not readonly.unavailable_reason():
        sets.mapping = readonly.allocate(count * sum(slabs), torch.device(device).index)
    whole = sets.mapping.tensor(sets.mapping.size) if sets.mapping is not None else None
    try:
        at = 0
        for k in range(count):
            if k:
                made = spec.make_inputs(m, n, dtype, gen, "random", device)
            guard = []
            for d, x, size in zip(spec.inputs, made, slabs):
                within = whole[at : at + size] if whole is not None else None
                at += size
                g_ = guarded(d.name, tuple(x.shape), x.dtype, device, within=within)
                g_.view.copy_(x)
                guard.append(g_)
            del made
            sets.guarded.append(guard)
            sets.prints.append([fingerprint(g_.view) for g_ in guard])
    except BaseException:
        sets.release()
        raise
    return sets


_SETS: dict[tuple, InputSets] = {}


def cached_sets(spec: OpSpec, m: int, n: int, dtype: str, need: tuple[int, int] = (0, 0)) -> InputSets:
    """The input sets for (spec, shape, dtype), made once per worker process and reused by later
    candidates of the same problem while they stay untouched (another problem's are dropped).
    `need`: what the stage needs with its usual sets and with one; older shapes' sets are dropped
    while the GPU's free memory falls short of the first, and where it still does, the shape is
    timed on one set."""
    key = (spec.ref, m, n, dtype)
    forget_sets(keep=lambda k: k[0] == spec.ref and k[3] == dtype)
    if key in _SETS and _SETS[key].tampered() is None:
        _SETS[key] = _SETS.pop(key)  # most recently used last
        return _SETS[key]
    if key in _SETS:
        _SETS.pop(key).release()
    while _SETS and _free() < need[0]:
        _SETS.pop(next(iter(_SETS))).release()
    one = _free() < need[0]
    _SETS[key] = made = make_sets(spec, m, n, dtype, count=1 if one else None)
    return made


def _free() -> int:
    """What the GPU could give now: the driver's free memory and torch's cached, unused blocks."""
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info()[0]


def forget_sets(keep: Callable[[tuple], bool] = lambda k: False) -> None:
    """Drop the cached input sets whose key `keep` does not want."""
    for k in [k for k in _SETS if not keep(k)]:
        _SETS.pop(k).release()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
