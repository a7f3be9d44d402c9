"""Every kernel the matcher writes for KernelBench level 1, on the GPU against the float64
reference, at the judge's bounded verification sizes (M = 1, odd, large)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmcompile.agent import patterns
from llmcompile.specs import get_op
from tests.level1 import LEVEL1, needs_level1, sharing_gpu_memory, verify_runs
from tests.test_patterns import EXPECTED

pytestmark = [pytest.mark.gpu, needs_level1]

NUMS = sorted(n for nums in EXPECTED.values() for n in nums)


@pytest.mark.parametrize("num", NUMS)
def test_matched_kernel_is_right(num: int, tmp_path: Path) -> None:
    import torch

    from llmcompile.harness.verify import compare, poison

    (path,) = LEVEL1.glob(f"{num}_*.py")
    spec = get_op(str(path))
    m = patterns.match(spec)

    def body() -> None:
        for mm, _, fn, ins, outs in verify_runs(spec, m.source, spec.dtypes[0], tmp_path, num):
            bad = compare(spec, spec.dtypes[0], ins, outs)
            assert bad is None, f"{path.name} M={mm}: {bad}"
            if m.pattern in ("total", "norm"):  # partials folded in a fixed order: the same bits every run
                first = [o.clone() for o in outs]
                poison(outs)
                fn(*ins, *outs, *spec.scalars.values())
                assert all(
                    torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
                    for a, b in zip(first, outs)
                )

    sharing_gpu_memory(body)
