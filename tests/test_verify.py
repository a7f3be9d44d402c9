"""CPU (CI): the numeric checks of the verify stage: tolerances fair to honest reductions,
KernelBench's verdict beside ours, and the timed-output check where rows are not independent."""

from __future__ import annotations

import pytest
import torch

from llmcompile.harness import verify
from llmcompile.specs import OpSpec, TensorDesc, Tolerance

R, C = 65537, 64


def _column_sum_spec(torch_fn=lambda x: x.sum(0)) -> OpSpec:
    return OpSpec(
        "colsum",
        "sum over dim 0",
        (TensorDesc("x", ("M", str(C))), TensorDesc("out", (str(C),), output=True)),
        lambda x: [x.sum(0)],
        lambda *a: [],
        tolerance={"float32": Tolerance(1e-4, 1e-4)},
        torch_fn=torch_fn,
    )


@pytest.fixture(scope="module")
def cancelling() -> tuple[torch.Tensor, torch.Tensor]:
    """Columns whose sums cancel terms ~250x larger than the result, summed in row order in
    fp32 (as a kernel that walks the rows would)."""
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(R, C, generator=g, dtype=torch.float64) * 2 - 1) * 250
    x = (x - x.mean(0) + torch.rand(C, generator=g, dtype=torch.float64) / R * 1000).float()
    acc = torch.zeros(C)
    for row in x:
        acc += row
    return x, acc


def test_row_order_sum_is_accepted_for_its_error_scale(
    cancelling: tuple[torch.Tensor, torch.Tensor], monkeypatch: pytest.MonkeyPatch
) -> None:
    x, acc = cancelling
    spec = _column_sum_spec()
    ref = x.double().sum(0)
    assert float(((acc.double() - ref).abs() / ref.abs()).max()) > 1e-4  # a fixed rtol rejects it
    assert verify.compare(spec, "float32", [x], [acc]) is None
    # without the widening the same outputs fail: the scaling is what lets them through
    monkeypatch.setattr(verify, "OWN_ERROR_FACTOR", 0.0)
    monkeypatch.setattr(verify, "MAGNITUDE_FACTOR", 0.0)
    monkeypatch.setattr(verify, "ORDER_FACTOR", 0.0)
    monkeypatch.setattr(verify, "SENSITIVITY_FACTOR", 0.0)
    assert verify.compare(spec, "float32", [x], [acc]) is not None


def test_widened_tolerance_still_rejects_a_wrong_element(cancelling: tuple[torch.Tensor, torch.Tensor]) -> None:
    x, acc = cancelling
    wrong = acc.clone()
    row = int((x[:, 7].abs() > 20).nonzero()[0])
    wrong[7] -= x[row, 7]  # one row left out of one column: an error 100x the honest one
    bad = verify.compare(_column_sum_spec(), "float32", [x], [wrong])
    assert bad is not None and bad.index == (7,) and bad.count == 1


def _scale_spec() -> OpSpec:
    return OpSpec(
        "scale",
        "2x",
        (TensorDesc("x", ("M", "N")), TensorDesc("out", ("M", "N"), output=True)),
        lambda x: [2 * x],
        lambda *a: [],
        torch_fn=lambda x: 2 * x,
    )


@pytest.mark.parametrize(
    ("error", "ours", "kernelbench"), [(0.0, True, True), (5e-3, False, True), (5e-2, False, False)]
)
def test_kernelbench_verdict_is_recorded_beside_ours(error: float, ours: bool, kernelbench: bool) -> None:
    x = torch.rand(64, 256, generator=torch.Generator().manual_seed(1)) + 1.0
    got = 2 * x * (1 + error)
    tally = verify.KernelBenchTally()
    assert (verify.compare(_scale_spec(), "float32", [x], [got], tally=tally) is None) == ours
    assert tally.checked == 1 and tally.ok == kernelbench


def test_where_torch_own_program_raises_float64_alone_judges() -> None:
    def refuses(x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("expected scalar type BFloat16 but found Float")

    spec = OpSpec(**{**_scale_spec().__dict__, "torch_fn": refuses})
    x = torch.rand(64, 256, generator=torch.Generator().manual_seed(1)) + 1.0
    tally = verify.KernelBenchTally()
    assert verify.compare(spec, "float32", [x], [2 * x], tally=tally) is None
    assert tally.ok is None and "raised RuntimeError: expected scalar type" in tally.as_dict()["torch_failed"]
    assert verify.compare(spec, "float32", [x], [2.01 * x]) is not None
    with pytest.raises(verify.TorchProgramFailed):
        verify.torch_own(spec, [x])


def test_outputs_of_dependent_rows_are_checked_against_torch_in_chunks() -> None:
    """x / ||x|| over the whole tensor: a chunk of rows has no reference of its own."""
    spec = OpSpec(
        "frobenius",
        "x / norm(x)",
        (TensorDesc("x", ("M", "N")), TensorDesc("out", ("M", "N"), output=True)),
        lambda x: [x / torch.linalg.vector_norm(x)],
        lambda *a: [],
        torch_fn=lambda x: x / torch.linalg.vector_norm(x),
        independent_rows=False,
        tolerance={"float32": Tolerance(1e-5, 1e-4)},
    )
    spec = OpSpec(
        **{**spec.__dict__, "tensors": (TensorDesc("x", ("M", "300")), TensorDesc("out", ("M", "300"), output=True))}
    )
    assert not verify.rows_independent(spec)
    x = torch.rand(100, 300, generator=torch.Generator().manual_seed(2))
    good = x / torch.linalg.vector_norm(x)
    tally = verify.KernelBenchTally()
    assert verify.compare_rows(spec, "float32", [x], [good.clone()], chunk_elems=1000, tally=tally) is None
    assert tally.ok
    # normalised by the norm of its chunk of rows alone: right within the chunk, wrong overall
    per_chunk = torch.cat([c / torch.linalg.vector_norm(c) for c in x.split(10)])
    bad = verify.compare_rows(spec, "float32", [x], [per_chunk], chunk_elems=1000)
    assert bad is not None and "torch's own output" in bad.output
    wrong = good.clone()
    wrong[73, 5] = float("nan")
    bad = verify.compare_rows(spec, "float32", [x], [wrong], chunk_elems=1000)
    assert bad is not None and bad.index == (73, 5) and bad.count == 1


def test_where_neither_float64_fits_nor_torch_runs_the_judge_says_it_cannot_check() -> None:
    """compare_own runs where the float64 reference was ruled out: torch's program failing there
    is the judge's limit (never a verdict on the kernel), and neither program runs again."""
    runs: list[str] = []

    def refuses(x: torch.Tensor) -> torch.Tensor:
        runs.append("torch")
        raise RuntimeError("numel exceeds the int32 index")

    def reference(x: torch.Tensor) -> list[torch.Tensor]:
        runs.append("float64")
        return [x / torch.linalg.vector_norm(x)]

    spec = OpSpec(
        "frobenius",
        "x / norm(x)",
        (TensorDesc("x", ("M", "N")), TensorDesc("out", ("M", "N"), output=True)),
        reference,
        lambda *a: [],
        torch_fn=refuses,
        independent_rows=False,
    )
    x = torch.rand(8, 32, generator=torch.Generator().manual_seed(3))
    assert verify.check_method(spec, [x], [x.clone()], free_bytes=1) == "torch's own output"
    with pytest.raises(verify.CannotCheck, match="numel exceeds the int32 index"):
        verify.compare_rows(spec, "float32", [x], [x.clone()], free_bytes=1)
    assert runs == ["torch"]


@pytest.mark.parametrize("op", ["rmsnorm_bwd", "layernorm_bwd"])
def test_sums_over_rows_are_not_checked_chunk_by_chunk(op: str) -> None:
    """A norm backward's dw sums every row: a chunk of rows has no dw of its own, so the check
    of large outputs compares with torch's whole answer (it once compared the full dw with a
    chunk's partial sum and rejected right answers)."""
    from llmcompile.specs import get_op

    spec = get_op(op)
    assert not verify.rows_independent(spec) and verify.rows_independent(get_op("cross_entropy_fused"))
    inputs = spec.make_inputs(64, 32, "float32", torch.Generator().manual_seed(0), "random", "cpu")
    right = [r.float() for r in spec.run_reference(inputs)]
    assert verify.compare_rows(spec, "float32", inputs, right, chunk_elems=8 * 32) is None
    wrong = [right[0], right[1] * 1.01, *right[2:]]
    assert verify.compare_rows(spec, "float32", inputs, wrong, chunk_elems=8 * 32) is not None


def _sum_spec(rows: int, cols: int, exact: str = "") -> OpSpec:
    return OpSpec(
        "sumsq",
        "sum of squares over rows",
        (TensorDesc("x", (str(rows), str(cols))), TensorDesc("out", (str(cols),), output=True)),
        lambda x: [x.pow(2).sum(0)],
        lambda *a: [],
        tolerance={"float32": Tolerance(1e-5, 1e-4), "bfloat16": Tolerance(8e-3, 2e-2)},
        torch_fn=lambda x: x.pow(2).sum(0),
        exact=exact,
    )


def test_the_bound_grows_with_the_reduction_length_and_the_result() -> None:
    """u (4 |terms| + 4 sqrt(K) |ref|): K from the shapes (inputs per output), |terms| the
    reference on |x|; it admits one thread summing 16384 squares in sequence, not fp16."""
    x = torch.randn(16384, 8, generator=torch.Generator().manual_seed(3))
    spec = _sum_spec(16384, 8)
    assert verify.reduction_length(spec, [x], torch.empty(8)) == 16384
    assert verify.reduction_length(spec, [x], torch.empty(16384, 8)) == 1
    seq = torch.zeros(8)
    for row in x.pow(2):
        seq += row  # the honest order that errs most
    ref = verify.Reference(spec, "float32", [x])
    assert ref.check([seq]) is None and 0.0 < ref.ratio([seq]) < 1.0
    half = torch.zeros(8, dtype=torch.float16)
    for row in x.pow(2)[:2048]:
        half += row.half()  # fp16 accumulation of the first 2048 rows, then the rest in fp32
    acc = half.float() + x.pow(2)[2048:].sum(0)
    assert ref.check([acc]) is not None and ref.ratio([acc]) > 1.0
    # the same slack computed directly
    slack = verify.order_slack(torch.tensor([100.0]), torch.tensor([100.0]), 16384)
    assert float(slack) == pytest.approx(verify.FP32_ROUNDOFF * (4 * 100 + 4 * 128 * 100))


def test_exact_cases_allow_one_rounding_for_a_sum_and_a_division_more_for_a_mean() -> None:
    r = torch.tensor([0.0, 7.0, 1000.0, -3.5], dtype=torch.float64)
    mags = torch.tensor([10.0, 10.0, 1000.0, 10.0], dtype=torch.float64)
    tol = verify.exact_tolerance(r, mags, torch.float32, "sum")
    assert tol[0] == 0 and tol[2] == 2.0**-14  # one fp32 ulp at 1000; nothing at an exact zero
    assert (verify.exact_tolerance(r, mags, torch.float32, "divided") > tol).all()
    assert verify.exact_tolerance(r, mags, torch.bfloat16, "sum")[2] == 4.0  # one bf16 ulp at 1000
    with pytest.raises(ValueError):
        verify.exact_tolerance(r, mags, torch.float32, "roughly")
    # a sum of small integers: exact, or off by a skipped term
    x = torch.randint(-4, 5, (4096, 8), generator=torch.Generator().manual_seed(4)).float()
    spec = _sum_spec(4096, 8, exact="sum")
    ref = verify.Reference(spec, "float32", [x])
    assert ref.check([x.pow(2).sum(0)], exact="sum") is None
    skipped = x.pow(2)[1:].sum(0)
    bad = ref.check([skipped], exact="sum")
    assert bad is not None and bad.count == int((x[0] != 0).sum())


def test_an_overflow_torch_makes_too_passes_and_no_other() -> None:
    """A column product past fp32's range: torch's own fp32 run gives inf where the float64
    reference is finite, so a kernel's inf there is no fault of the kernel (the judge once
    failed an honest prod over the batch dim for it); an inf where torch's run is finite still fails."""
    spec = OpSpec(
        "colprod",
        "product over dim 0",
        (TensorDesc("x", ("M", "4")), TensorDesc("out", ("4",), output=True)),
        lambda x: [x.prod(0)],
        lambda *a: [],
        torch_fn=lambda x: x.prod(0),
    )
    x = torch.ones(64, 4)
    x[:, 0] = 1e3  # 1e192 in float64, inf in fp32
    assert verify.compare(spec, "float32", [x], [x.prod(0)]) is None
    wrong = x.prod(0)
    wrong[1] = float("inf")
    bad = verify.compare(spec, "float32", [x], [wrong])
    assert bad is not None and bad.index == (1,) and bad.count == 1
    # the bound without torch's run (widen_by_own=False) holds the kernel to the reference alone
    assert verify.compare(spec, "float32", [x], [x.prod(0)], widen_by_own=False) is not None


def _cv_spec(rows: int, n: int) -> OpSpec:
    return OpSpec(
        "cv",
        "std over mean of each row",
        (TensorDesc("x", (str(rows), str(n))), TensorDesc("out", (str(rows),), output=True)),
        lambda x: [x.std(1) / x.mean(1)],
        lambda *a: [],
        tolerance={"float32": Tolerance(1e-4, 1e-4)},
        torch_fn=lambda x: x.std(1) / x.mean(1),
    )


def test_an_output_that_amplifies_its_reductions_rounding_gets_room_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A std / mean of rows whose mean is near 0: the mean's rounding is amplified by std /
    mean^2, which |terms| does not see. An honest fold of 32 threads a row (a block a thread,
    then Chan's merges, as the norm template folds 1024 fp32) passes on the sensitivity term
    alone (torch's own error left out); without it, it fails; a term left out still fails."""
    from tests.honest_reductions import blocks_then_chan

    x = torch.randn(4096, 1024, generator=torch.Generator().manual_seed(5))
    spec = _cv_spec(*x.shape)

    def fold(t: torch.Tensor) -> torch.Tensor:
        _, mean, m2 = blocks_then_chan(t.t().contiguous())
        return torch.sqrt(m2 / (t.shape[1] - 1)) / mean

    honest = fold(x)
    ref = verify.Reference(spec, "float32", [x], widen_by_own=False)
    assert ref.check([honest]) is None and ref.ratio([honest]) < 0.5
    skipped = x.clone()
    skipped[:, 512] = 0.0
    assert ref.check([fold(skipped)]) is not None
    monkeypatch.setattr(verify, "SENSITIVITY_FACTOR", 0.0)
    assert verify.Reference(spec, "float32", [x], widen_by_own=False).check([honest]) is not None


def test_the_moved_run_is_made_only_where_the_rest_of_the_rule_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sensitivity run costs a float64 reference: outputs within the rest of the rule never
    pay it, a failing check pays it once, and a float64 input is moved in a copy."""
    calls: list[int] = []
    real = verify._sensitivity
    monkeypatch.setattr(verify, "_sensitivity", lambda *a: calls.append(1) or real(*a))
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    spec = _scale_spec()
    ref = verify.Reference(spec, "float32", [x])
    assert ref.check([2 * x]) is None and calls == []
    assert ref.check([2 * x + 1]) is not None and ref.check([2 * x + 1]) is not None and calls == [1]
    before = x.clone()
    moved = ref.moved()[0]
    assert torch.equal(x, before)  # (the input is the judge's read-only copy in the verify stage)
    # 2x moved by u |x| (1 + r): each element by 0 or 4u |x|
    assert bool((moved <= 4 * verify.FP32_ROUNDOFF * x.abs() * (1 + 1e-6)).all()) and bool((moved > 0).any())


def test_an_infinite_reference_admits_itself_or_where_a_rounding_makes_it_finite_anything_but_nan() -> None:
    """log of a zero row's sum is -inf: a 0 there is wrong (rtol x inf once admitted any value but
    NaN). A std / mean of rows of integers that cancel exactly is +-inf, but a fold that divides
    as it goes gets a mean of 1e-9, not 0: the inputs moved by u |x| give a finite reference
    there, so any value but NaN passes."""
    log_spec = OpSpec(
        "logsum",
        "log of each row's sum of |x|",
        (TensorDesc("x", ("M", "N")), TensorDesc("out", ("M",), output=True)),
        lambda x: [torch.log(x.abs().sum(1))],
        lambda *a: [],
        torch_fn=lambda x: torch.log(x.abs().sum(1)),
    )
    x = torch.rand(8, 64, generator=torch.Generator().manual_seed(7)) + 0.5
    x[3] = 0.0
    right = torch.log(x.abs().sum(1))
    ref = verify.Reference(log_spec, "float32", [x])
    assert ref.check([right]) is None and ref.ratio([right]) < 1.0
    wrong = right.clone()
    wrong[3] = 0.0
    bad = ref.check([wrong])
    assert bad is not None and bad.index == (3,) and ref.ratio([wrong]) == float("inf")

    cycle = torch.tensor([1.0, -1.0, 2.0, -2.0]).repeat(16)
    rows = torch.stack([cycle, cycle + 1.0, cycle.roll(1)])  # means 0, 1, 0
    spec = _cv_spec(*rows.shape)
    r = verify.Reference(spec, "float32", [rows], widen_by_own=False)
    assert bool(torch.isinf(r.refs[0][[0, 2]]).all())
    inexact = r.refs[0].float().clone()
    inexact[0], inexact[2] = 1.5e8, -3.0e8  # a mean of +-1e-8 where it is 0
    assert r.check([inexact]) is None
    inexact[2] = float("nan")
    assert r.check([inexact]) is not None


def test_against_torchs_own_output_its_overflow_is_no_truth() -> None:
    """Checked against torch's own output (the float64 reference does not fit), an fp32 column
    product that overflows part way is inf in torch's run, while a kernel that rescales gets the
    right 1.0: it passes there; a NaN does not."""
    spec = _column_sum_spec(torch_fn=lambda x: x.prod(0))
    x = torch.tensor([[1e30] * C, [1e30] * C, [1e-30] * C, [1e-30] * C])
    assert bool(torch.isinf(x.prod(0)).all())
    right = torch.ones(C)
    assert verify.compare_own(spec, "float32", [x], [right]) is None
    right[3] = float("nan")
    bad = verify.compare_own(spec, "float32", [x], [right])
    assert bad is not None and bad.index == (3,)


def test_a_constant_rows_standardization_is_nan_in_torch_and_any_value_from_a_fold_that_rounds_its_mean() -> None:
    """(x - mean) / std of the degenerate case's constant row (3.0) is 0/0, NaN in float64 and in
    torch; a kernel that takes the mean as sum x (1/N) rounds it (N = 1000: 3.0000002) and gets -0.9995
    there. Moved by u |x| the row is not constant and the reference finite: any value passes
    there. A row of zeros stays 0/0 when moved, so there only a NaN passes."""
    spec = OpSpec(
        "standardize",
        "(x - mean) / std of each row",
        (TensorDesc("x", ("M", "N")), TensorDesc("out", ("M", "N"), output=True)),
        lambda x: [(x - x.mean(1, keepdim=True)) / x.std(1, keepdim=True)],
        lambda *a: [],
        torch_fn=lambda x: (x - x.mean(1, keepdim=True)) / x.std(1, keepdim=True),
    )
    x = torch.randn(4, 1000, generator=torch.Generator().manual_seed(8))
    x[1], x[2] = 3.0, 0.0
    mean = x.sum(1, keepdim=True) * torch.tensor(1 / 1000, dtype=torch.float32)
    d = x - mean
    got = d / torch.sqrt((d * d).sum(1, keepdim=True) / 999)
    assert bool(torch.isfinite(got[1]).all()) and bool(got[2].isnan().all())
    ref = verify.Reference(spec, "float32", [x])
    assert ref.check([got]) is None and ref.ratio([got]) < 1.0
    zeros_written = got.clone()
    zeros_written[2] = 0.0
    bad = ref.check([zeros_written])
    assert bad is not None and bad.index[0] == 2
