"""The guarded memory the judge lays a candidate's tensors in (`harness/guards.py`): guard bands,
fingerprints, the judge's own copy of the inputs (read-only on the GPU). The CPU tests run in CI;
the read-only copy needs the GPU's virtual memory."""

from __future__ import annotations

import pytest
import torch

from llmcompile.harness import guards
from tests.stand_ins import past_end


def test_fingerprints_see_a_swap() -> None:
    x = torch.randn(1000)
    y = x.clone()
    y[[3, 700]] = y[[700, 3]]
    assert guards.fingerprint(x) != guards.fingerprint(y)
    assert guards.fingerprint(x) == guards.fingerprint(x.clone())


def test_sets_laid_in_one_slab_keep_their_guard_bands_apart() -> None:
    shape, dtype = (3, 100), torch.bfloat16
    size = guards.slab_bytes(shape, dtype)
    assert size % 512 == 0 and size >= 2 * guards.GUARD_BYTES + 600
    slab = torch.zeros(2 * size, dtype=torch.uint8)
    a = guards.guarded("x", shape, dtype, "cpu", within=slab[:size])
    b = guards.guarded("x", shape, dtype, "cpu", within=slab[size:])
    a.view.fill_(1.0)
    b.view.fill_(2.0)
    assert a.guards_intact() and b.guards_intact()
    assert b.view.data_ptr() - a.view.data_ptr() == size and a.view.data_ptr() % 16 == 0
    past_end(a.view).fill_(0.0)
    assert not a.guards_intact() and b.guards_intact()


def test_the_nudge_moves_a_few_elements_of_the_first_floating_input_only() -> None:
    idx = torch.arange(6).reshape(2, 3)
    x = torch.randn(64, 1024)
    copy = guards.judge_copy([idx, x], on_device=False)
    copy.nudge(7)
    moved = copy.tensors[1] != x
    assert 1 <= int(moved.sum()) <= 64 and torch.equal(copy.tensors[0], idx)
    assert torch.equal(copy.tensors[1][moved], x[moved] + 1)
    other = guards.judge_copy([x], on_device=False)
    other.nudge(8)
    assert not torch.equal(other.tensors[0] != x, moved)  # a case's own draw


@pytest.mark.gpu
def test_the_judges_device_copy_is_read_only_between_its_loads() -> None:
    x = torch.randn(3, 1000, 333, device="cuda").to(torch.bfloat16)
    copy = guards.judge_copy([x], on_device=True)
    try:
        (t,) = copy.tensors
        assert copy.mappings[0].writable is False and t.shape == x.shape and t.dtype == x.dtype
        assert torch.equal(t.view(torch.uint8), x.view(torch.uint8))
        copy.nudge(3)
        moved = int((t != x).sum())
        assert 1 <= moved <= x.numel() // 1024 and copy.mappings[0].writable is False
        y = torch.randn_like(x)
        copy.load([y])
        assert torch.equal(t, y) and copy.mappings[0].writable is False
    finally:
        copy.release()


# Each way a candidate could write into the judge's device copy during its call: a kernel (a torch
# fill stands in), or its host code through the CUDA runtime (the sealed module may call CuTe DSL's
# runtime entries, which include memset and memcpy). Run in a child: a fault breaks the context.
_WRITES = {
    "a kernel": "t.fill_(0.0)",
    "the runtime's memset": "print('rc', rt.cudaMemset(t.data_ptr(), 0, 4096)[0])",
    "the runtime's copy": "print('rc', rt.cudaMemcpy(t.data_ptr(), z.data_ptr(), 4096, rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice)[0])",
}


@pytest.mark.gpu
@pytest.mark.parametrize("how", list(_WRITES))
def test_the_judges_device_copy_cannot_be_written_by_a_candidate(how: str) -> None:
    import subprocess
    import sys

    script = f"""
import torch
from cuda.bindings import runtime as rt
from llmcompile.harness import guards
x = torch.randn(1 << 20, device="cuda")
z = torch.zeros_like(x)
copy = guards.judge_copy([x], on_device=True)
(t,) = copy.tensors
print("attempted", flush=True)
{_WRITES[how]}
torch.cuda.synchronize()
print("unchanged" if torch.equal(t, x) else "CHANGED")
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    said = r.stdout + r.stderr
    assert "attempted" in r.stdout and "CHANGED" not in r.stdout, said
    # refused (an error code, then the copy unchanged) or faulted (the context broken)
    assert "unchanged" in r.stdout or (r.returncode != 0 and "CUDA" in r.stderr), said
    print(how, "->", r.stdout.split("attempted")[1].strip().replace("\n", " ") or r.stderr.strip()[-160:])
