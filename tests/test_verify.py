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


def test_chunked_comparison_finds_what_the_whole_one_finds() -> None:
    """The timed outputs are compared in chunks of rows (the float64 reference of a 17 GB
    input would not fit): a wrong row far from the first chunk is found, at its own index."""
    from llmcompile.verify import compare_rows

    spec = get_op("rmsnorm")
    x, w = torch.randn(1000, 64), torch.rand(64) + 0.5
    out = (x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()).float()
    assert compare_rows(spec, "float32", [x, w], [out], chunk_elems=640) is None
    out[957:] = float("nan")  # the last rows left unwritten, as a kernel skipping work would
    poison([out[957:]])
    bad = compare_rows(spec, "float32", [x, w], [out], chunk_elems=640)
    assert bad is not None and bad.index == (957, 0) and bad.unwritten == 3 * 64  # rows 957-959 of 950-959
    assert "`out[950:960]`" in bad.describe() and "never written" in bad.describe()
    whole = compare(spec, "float32", [x, w], [out])
    assert whole is not None and whole.index == bad.index
