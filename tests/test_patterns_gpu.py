"""Every kernel the matcher writes for KernelBench level 1, on the GPU against the float64
reference, at the judge's bounded verification sizes (M = 1, odd, large)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmcompile.agent import patterns
from llmcompile.specs import contract, get_op, verify_shapes
from tests.level1 import LEVEL1, needs_level1
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
    src = tmp_path / "k.py"
    src.write_text(m.source)
    dtype = spec.dtypes[0]
    mod = contract.load_module(src)
    entry, ws = contract.entry_of(mod), contract.workspace_of(mod)
    gen = torch.Generator().manual_seed(num)
    for mm, n in verify_shapes(spec):
        fn = contract.with_workspace(contract.compile_entry(entry, spec, dtype, n, workspace=ws), len(spec.tensors), ws)
        ins = spec.make_inputs(mm, n, dtype, gen, "random", "cuda")
        outs = spec.alloc_outputs(mm, n, dtype, "cuda")
        poison(outs)
        fn(*ins, *outs, *spec.scalars.values())
        torch.cuda.synchronize()
        bad = compare(spec, dtype, ins, outs)
        assert bad is None, f"{path.name} M={mm}: {bad}"
        if m.pattern in ("total", "norm"):  # partials folded in a fixed order: the same bits every run
            first = [o.clone() for o in outs]
            poison(outs)
            fn(*ins, *outs, *spec.scalars.values())
            assert all(
                torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
                for a, b in zip(first, outs)
            )
