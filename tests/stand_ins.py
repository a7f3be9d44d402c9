"""Python stand-ins for what the judge's GPU stages meet: kernels as torch functions (honest ones
here; each test writes its cheat beside them), a read-only mapping that records its access changes,
the timed calls as the benchmark makes them, and `profile_candidate` whole on the CPU."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch

from llmcompile.harness import gpu_stages, input_sets, timed_calls
from llmcompile.specs import get_op

SOFTMAX = get_op("softmax")
RMSNORM = get_op("rmsnorm")


def past_end(t: torch.Tensor, k: int = 0) -> torch.Tensor:
    """The element k places past the end of `t`'s view (in its storage): what a kernel that
    indexes one too far touches."""
    return torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), t.storage_offset() + t.numel() + k, (1,))


def softmax(x: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(torch.softmax(x.double(), -1).to(out.dtype))


def rmsnorm(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, eps: float) -> None:
    xd = x.double()
    out.copy_((xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * w.double()).to(out.dtype))


class Mapping:
    """A stand-in for a read-only-capable mapping: records the access changes and the free."""

    def __init__(self) -> None:
        self.writable, self.changes, self.freed = True, [], False

    def set_writable(self, writable: bool) -> None:
        self.writable = writable
        self.changes.append(writable)

    def free(self) -> None:
        self.freed = True

    def alias(self) -> SimpleNamespace:
        """The judge's writable view of the inputs: on the CPU, the tensors themselves."""
        self.aliases = getattr(self, "aliases", 0) + 1
        return SimpleNamespace(view_of=lambda t: t, free=lambda: None)


def call_as_timed(fn: Callable, sets: input_sets.InputSets, rounds: int = 3) -> timed_calls.TimedCalls:
    """The calls as the benchmark makes them: warm-ups, then rounds of one call per input set."""
    timed = timed_calls.TimedCalls(fn, SOFTMAX, 64, 256, "float32", [], sets)
    for _ in range(rounds):
        for s in sets.views:
            timed(*s)
    return timed


def profile_on_cpu(
    monkeypatch: pytest.MonkeyPatch,
    candidate: Callable,
    mapping: Mapping,
    sets: input_sets.InputSets | None = None,
    dtype: str = "float32",
    disturbance: str | None = None,
) -> tuple[object, list]:
    """`profile_candidate` whole on the CPU, its timing stubbed (each call made twice), on sets
    whose mapping is the stand-in `mapping`: (its result or the exception it raised, the progress
    events with the mapping's access at each)."""
    from llmcompile.bench import timing

    sets = sets or input_sets.make_sets(SOFTMAX, 64, 256, "float32", count=2, device="cpu")
    sets.mapping = mapping
    monkeypatch.setattr(gpu_stages, "cached_sets", lambda *a, **k: sets)
    for name in ("settle", "wait_calm"):
        monkeypatch.setattr(timing, name, lambda *a, **k: None)
    monkeypatch.setattr(timing, "disturbance", lambda *a, **k: disturbance)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    def time_calls(calls, graph=True, keep=False):
        def run() -> None:
            for c in calls:
                c()

        run()  # (a warm-up, then the timed run)
        run()
        return timing.Timing(1.0, 1.0, 1, graph, replay=run if keep else None)

    monkeypatch.setattr(timing, "time_calls", time_calls)
    events: list = []
    try:
        out: object = gpu_stages.profile_candidate(
            {sets.views[0][0].shape[1]: candidate}, SOFTMAX, dtype, [tuple(sets.views[0][0].shape)], (3.0, 3.0), ["eager"],
            progress=lambda m, n, what: events.append((what, mapping.writable)),
        )  # fmt: skip
    except Exception as e:  # noqa: BLE001 - what the worker would see
        out = e
    return out, events
