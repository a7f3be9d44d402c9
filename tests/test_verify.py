from __future__ import annotations

import torch

from llmcompile.ops import get_op
from llmcompile.verify import compare, poison


def _softmax_case():
    spec = get_op("softmax")
    x = torch.randn(4, 64)
    return spec, x, torch.softmax(x.double(), -1).float()


def test_correct_output_passes() -> None:
    spec, x, out = _softmax_case()
    assert compare(spec, "float32", [x], [out]) is None


def test_wrong_element_is_located() -> None:
    spec, x, out = _softmax_case()
    out[2, 17] += 0.01
    bad = compare(spec, "float32", [x], [out])
    assert bad is not None and bad.index == (2, 17) and bad.count == 1 and bad.unwritten == 0
    assert "index [2, 17]" in bad.describe()


def test_unwritten_poison_is_reported() -> None:
    spec, x, out = _softmax_case()
    poisoned = out.clone()
    poison([poisoned])
    poisoned[:2] = out[:2]
    bad = compare(spec, "float32", [x], [poisoned])
    assert bad is not None and bad.unwritten == 2 * 64 and "never written" in bad.describe()


def test_nan_where_reference_is_nan_is_accepted() -> None:
    spec = get_op("softmax")
    x = torch.randn(3, 16)
    x[1] = float("-inf")
    out = torch.softmax(x.double(), -1).float()
    assert torch.isnan(out[1]).all()
    assert compare(spec, "float32", [x], [out]) is None


def test_computed_nan_is_not_counted_as_unwritten() -> None:
    spec, x, out = _softmax_case()
    out[1, 3] = float("nan")  # a NaN the kernel wrote, not the poison
    bad = compare(spec, "float32", [x], [out])
    assert bad is not None and bad.count == 1 and bad.unwritten == 0


def test_poison_bits_survive_for_each_dtype() -> None:
    from llmcompile.verify import poisoned

    for dt in (torch.float32, torch.bfloat16, torch.float16, torch.int64):
        t = torch.zeros(8, dtype=dt)
        poison([t])
        assert bool(poisoned(t).all())
        t[3] = 1
        assert int(poisoned(t).sum()) == 7
