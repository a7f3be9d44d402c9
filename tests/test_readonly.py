"""CPU (CI): read-only device memory's own failures are the judge's, never a candidate's. (The
mappings themselves need the GPU: tests/test_guards.py, tests/test_input_sets.py and tests/test_harness_gpu.py.)"""

from __future__ import annotations

import enum

import pytest
import torch

from llmcompile.harness import guards, readonly


class _Driver:
    """cuMemCreate that runs out of memory `fails` times, then succeeds."""

    class CUresult(enum.IntEnum):
        CUDA_SUCCESS = 0
        CUDA_ERROR_OUT_OF_MEMORY = 2

    def __init__(self, fails: int) -> None:
        self.fails, self.calls = fails, 0

    def cuMemCreate(self, size: int, prop: object, flags: int) -> tuple:
        self.calls += 1
        if self.calls <= self.fails:
            return (self.CUresult.CUDA_ERROR_OUT_OF_MEMORY, None)
        return (self.CUresult.CUDA_SUCCESS, "handle")


def test_memory_torch_caches_is_let_go_and_asked_for_again(monkeypatch: pytest.MonkeyPatch) -> None:
    emptied: list[int] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    cu = _Driver(fails=1)
    assert readonly._create(cu, 1 << 21, None) == "handle"
    assert cu.calls == 2 and emptied == [1]
    assert readonly._create(_Driver(fails=0), 1 << 21, None) == "handle" and emptied == [1]


def test_running_out_is_an_out_of_memory_error_not_a_device_fault(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    with pytest.raises(torch.OutOfMemoryError) as e:
        readonly._create(_Driver(fails=2), 1 << 21, None)
    assert not guards.device_fault(e.value)
