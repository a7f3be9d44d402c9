from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llmcompile.harness import verify
from llmcompile.specs import OpError, OpSpec, get_op, verify_shapes

PROBLEMS = Path(__file__).resolve().parents[1] / "evals" / "problems"


@pytest.mark.parametrize("name", ["add_rmsnorm", "swiglu", "l2norm_rows", "mean_dim1", "mse_rows"])
def test_problem_loads_with_symbolic_m(name: str) -> None:
    spec = get_op(str(PROBLEMS / f"{name}.py"))
    assert spec.tensors[0].dims[0] == "M" and spec.outputs and spec.fixed_shapes
    m0, n = spec.fixed_shapes[0]
    ins = spec.make_inputs(3, n, spec.dtypes[0], torch.Generator().manual_seed(0), "random", "cpu")
    assert all(t.shape[0] == 3 for t, d in zip(ins, spec.inputs) if d.dims[0] == "M")
    outs = spec.run_reference(ins)
    assert [tuple(o.shape) for o in outs] == [d.shape(3, n) for d in spec.outputs]
    assert spec.bytes_moved(m0, n, spec.dtypes[0]) > 0


def test_non_last_dim_reduction_keeps_fixed_dims() -> None:
    spec = get_op(str(PROBLEMS / "mean_dim1.py"))
    assert spec.tensors[0].dims == ("M", "64", "64", "128") and spec.outputs[0].dims == ("M", "64", "128")


def test_malformed_and_unknown(tmp_path: Path) -> None:
    with pytest.raises(OpError, match="unknown op 'nope'"):
        get_op("nope")
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\n\ndef get_inputs():\n    return []\n")
    with pytest.raises(OpError, match="Model"):
        get_op(str(bad))
    with pytest.raises(OpError, match="no such problem file"):
        get_op(str(tmp_path / "missing.py"))


LEVEL1 = Path(__file__).resolve().parents[2] / "shared" / "kernelbench" / "level1"
needs_level1 = pytest.mark.skipif(not LEVEL1.is_dir(), reason=f"KernelBench level 1 not beside the checkout ({LEVEL1})")


@needs_level1
def test_every_level1_problem_loads_and_verifies_on_bounded_sizes() -> None:
    from llmcompile.specs import VERIFY_ELEMS, verify_shapes
    from llmcompile.specs.kernelbench import load_dir

    specs, errors = load_dir(LEVEL1)
    assert errors == {} and len(specs) == 50
    for spec in specs:
        (m0, n) = spec.fixed_shapes[0]
        row = torch.Size(spec.tensors[0].shape(1, n)).numel()
        shapes = verify_shapes(spec)
        if spec.batchable:
            assert shapes[0][0] == 1 and all(m * row <= max(2 * VERIFY_ELEMS, 3 * row) for m, _ in shapes), spec.name
        else:  # means something only at its own size: checked there alone
            assert shapes == [(m0, n)], spec.name
    fixed = [s.name for s in specs if not s.batchable]
    assert fixed == ["100_HingeLoss"]  # its targets broadcast along the last dim: M must equal N
    # rows whose outputs depend on other rows (a norm of the whole tensor, a loss over the
    # batch) are never checked in chunks of rows
    by_name = {s.name: s for s in specs}
    for name in ("37_FrobeniusNorm_", "94_MSELoss", "95_CrossEntropyLoss", "99_TripletMarginLoss"):
        assert not verify.rows_independent(by_name[name]), name
    for name in (
        "36_RMSNorm_",
        "38_L1Norm_",
        "34_InstanceNorm",
        "4_Matrix_vector_multiplication_",
        "47_Sum_reduction_over_a_dimension",
    ):
        assert by_name[name].independent_rows and verify.rows_independent(by_name[name]), name


@needs_level1
@pytest.mark.parametrize(
    "name, scalars, dtypes",
    [
        ("5_Matrix_scalar_multiplication", {"arg1": 3.14}, ["float32"]),  # a Python float input
        ("93_masked_cumsum", {}, ["float32", "bool"]),  # a bool mask
        ("95_CrossEntropyLoss", {}, ["float32", "int64"]),  # int indices
        ("47_Sum_reduction_over_a_dimension", {}, ["float32"]),
    ],
)
def test_inputs_of_every_kind_reach_the_reference(name: str, scalars: dict, dtypes: list[str]) -> None:
    spec = get_op(str(LEVEL1 / f"{name}.py"))
    assert spec.scalars == scalars and [t.dtype or spec.dtypes[0] for t in spec.inputs] == dtypes
    _, n = spec.fixed_shapes[0]
    ins = spec.make_inputs(3, n, spec.dtypes[0], torch.Generator().manual_seed(0), "random", "cpu")
    assert [str(t.dtype).removeprefix("torch.") for t in ins] == dtypes
    assert all(t.shape[0] == 3 for t, d in zip(ins, spec.inputs) if d.dims[0] == "M")
    got = spec.run_reference(ins)
    want = spec.torch_fn(*ins, *spec.scalars.values())  # what the eager baseline calls
    want = list(want) if isinstance(want, (list, tuple)) else [want]
    assert all(torch.allclose(g.double(), w.double(), rtol=1e-4, atol=1e-4) for g, w in zip(got, want))


@needs_level1
def test_list_shows_every_level1_problem(capsys: pytest.CaptureFixture[str]) -> None:
    from llmcompile.cli import main

    assert main(["list", str(LEVEL1)]) == 0
    out = capsys.readouterr().out
    assert "NOT LOADED" not in out and "5_Matrix_scalar_multiplication" in out and "arg1=3.14" in out


def test_a_float64_reference_leaves_the_parameters_and_the_mode_alone(tmp_path: Path) -> None:
    """The float64 reference once converted the shared model in place, so every later input's
    weight came out float64 (a kernel then refused it as the candidate's error); and KernelBench
    runs the model in training mode, where BatchNorm normalizes with the batch's statistics."""
    f = tmp_path / "bn.py"
    f.write_text(
        "import torch\nfrom torch import nn\n\nclass Model(nn.Module):\n    def __init__(self, c):\n"
        "        super().__init__()\n        self.bn = nn.BatchNorm2d(c)\n    def forward(self, x):\n"
        "        return self.bn(x)\n\ndef get_inputs():\n    return [torch.rand(6, 4, 8, 8) * 3 + 5]\n\n"
        "def get_init_inputs():\n    return [4]\n"
    )
    spec = get_op(str(f))
    gen = torch.Generator().manual_seed(0)
    ins = spec.make_inputs(6, 8, "float32", gen, "random", "cpu")
    ref = spec.run_reference([t.double() for t in ins])[0]
    again = spec.make_inputs(6, 8, "float32", gen, "random", "cpu")
    assert [t.dtype for t in again] == [torch.float32] * 3
    x, w, b = (t.double() for t in ins)
    mean, var = x.mean((0, 2, 3), keepdim=True), x.var((0, 2, 3), unbiased=False, keepdim=True)
    want = (x - mean) / torch.sqrt(var + 1e-5) * w.view(1, -1, 1, 1) + b.view(1, -1, 1, 1)
    assert torch.allclose(ref, want, atol=1e-9)  # batch statistics, not the running ones
    assert not spec.independent_rows


@pytest.mark.parametrize(
    ("forward", "independent"),
    [
        # (a scan along the batch: its first row is its input's alone, the next ones are not; its
        # timed outputs checked in chunks of rows failed an honest kernel from the second chunk on)
        ("torch.cumsum(x, 0)", False),
        ("torch.cummax(x, dim=0).values", False),
        ("torch.cumsum(x.flip(0), 0).flip(0)", False),
        ("torch.cumsum(x, 1)", True),
        ("x.sum(0, keepdim=True).expand_as(x) + x", False),
    ],
)
def test_rows_that_depend_on_earlier_rows_are_not_independent(forward: str, independent: bool, tmp_path: Path) -> None:
    from tests.level1 import problem_file

    spec = get_op(str(problem_file(tmp_path, "s", forward, "(64, 32, 16)")))
    assert spec.independent_rows is independent and verify.rows_independent(spec) is independent


def test_a_float64_reference_keeps_float64_through_a_models_casts(tmp_path: Path) -> None:
    """A model that computes a step in fp32 and casts back (`self.ln(x.float()).to(x.dtype)`): the
    reference had cast float64 to fp32 there, and met its float64 weight with it (torch raised on
    the GPU); it keeps float64 through the casts, and the model's own dtypes are left alone."""
    f = tmp_path / "cast.py"
    f.write_text(
        "import torch\nfrom torch import nn\n\nclass Model(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        self.ln = nn.LayerNorm(64)\n    def forward(self, x):\n"
        "        return self.ln(x.float()).to(torch.bfloat16) * x.to(torch.float32).type(torch.float16)\n\n"
        "def get_inputs():\n    return [torch.rand(6, 64, dtype=torch.bfloat16)]\n\ndef get_init_inputs():\n    return []\n"
    )
    spec = get_op(str(f))
    ins = spec.make_inputs(6, 64, "bfloat16", torch.Generator().manual_seed(0), "random", "cpu")
    (ref,) = spec.run_reference([t.double() for t in ins])
    x, w, b = (t.double() for t in ins)
    assert ref.dtype == torch.float64
    assert torch.allclose(ref, torch.nn.functional.layer_norm(x, (64,), w, b) * x, atol=1e-12)
    assert spec.torch_fn(*ins).dtype == torch.float32 and x.float().dtype == torch.float32  # (bf16 x fp16)


def test_an_output_of_the_batch_flattened_to_rows_is_batchable(tmp_path: Path) -> None:
    """(B, T, C) viewed as (B * T, C) has T rows an item of the batch ("M*T"): verified at any
    batch, as an output of one row an item is; an output of a shape of its own that happens to be
    a multiple of the batch stays that shape."""
    from llmcompile.specs.kernelbench import load_problem

    def spec(name: str, forward: str, shape: str = "batch_size, 32, 64") -> OpSpec:
        f = tmp_path / f"{name}.py"
        f.write_text(
            "import torch\nfrom torch import nn\n\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
            f"        return {forward}\n\n\nbatch_size = 16\n\n\ndef get_inputs():\n    return [torch.randn({shape})]"
            "\n\n\ndef get_init_inputs():\n    return []\n"
        )
        return load_problem(f)

    flat = spec("flat", "torch.softmax(x.view(-1, 64), -1)")
    assert flat.batchable and flat.outputs[0].dims == ("M*32", "64") and flat.outputs[0].shape(3, 64) == (96, 64)
    assert verify_shapes(flat)[0] == (1, 64)
    sums = spec("sums", "x.flatten(0, 1).sum(-1)")
    assert sums.batchable and sums.outputs[0].dims == ("M*32",)
    cols = spec("cols", "x.sum(0)", "batch_size, 32")  # ((32,): twice the batch, and its own)
    assert cols.batchable and cols.outputs[0].dims == ("32",)
    both = spec("both", "x.view(-1, 64), x.sum(0)")
    assert both.batchable and [o.dims for o in both.outputs] == [("M*32", "64"), ("32", "64")]


def test_exactness_is_read_from_the_graph(tmp_path: Path) -> None:
    """OpSpec.exact: "sum" where every node keeps small integers small integers, "divided" where
    one dividing node ends it, "" otherwise (a fractional constant or scalar, an exp, a division
    in the middle)."""

    def problem(name: str, forward: str, args: str = "[torch.randn(16, 32)]") -> str:
        f = tmp_path / f"{name}.py"
        f.write_text(
            "import torch\nfrom torch import nn\n\n\nclass Model(nn.Module):\n    def forward(self, x, *a):\n"
            f"        return {forward}\n\n\ndef get_inputs():\n    return {args}\n\n\ndef get_init_inputs():\n    return []\n"
        )
        from llmcompile.specs.kernelbench import load_problem

        return load_problem(f).exact

    assert problem("colsum", "x.abs().sum(0)") == "sum"
    assert problem("cumsum", "torch.cumsum(x * 2, dim=1)") == "sum"
    assert problem("cummax", "torch.cummax(x, dim=1)[0]") == "sum"
    assert problem("mean", "torch.mean((x - 1) ** 2)") == "divided"
    assert problem("half", "x * 0.5") == ""
    assert problem("exp", "torch.exp(x).sum(0)") == ""
    assert problem("middle", "(x / x.abs().sum(0)).sum(1)") == ""
    assert problem("scaled", "x * a[0]", "[torch.randn(16, 32), 3.14]") == ""


def test_whole_inputs_are_made_on_a_gpu_only_where_it_has_room(monkeypatch: pytest.MonkeyPatch) -> None:
    from llmcompile.specs import kernelbench

    whole = [torch.empty(1024, 1024, dtype=torch.bfloat16, device="meta")]  # 2 MiB: 6 to make
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: 3 << 20)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: 1 << 20)  # 2 MiB cached
    for free, room in ((4 << 20, True), ((4 << 20) - 1, False)):
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None, f=free: (f, 80 << 30))
        assert kernelbench._room(whole, "cuda:1") is room
    assert not kernelbench._room(whole, "cpu") and not kernelbench._room(whole, None)


@pytest.mark.gpu
def test_a_file_without_a_batch_variable_is_sliced_on_the_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from llmcompile.specs import kernelbench

    f = tmp_path / "spelled.py"
    f.write_text(
        "from pathlib import Path\nimport torch\nfrom torch import nn\n\nclass Model(nn.Module):\n"
        "    def forward(self, x):\n        return torch.var(x)\n\ndef get_inputs():\n"
        "    x = torch.randn(4096, 8192, dtype=torch.bfloat16)\n"
        "    Path(__file__).with_suffix('.where').write_text(x.device.type)\n    return [x]\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    spec = get_op(str(f))
    for room, where in ((3, "cuda"), (1 << 40, "cpu")):  # (no GPU has room for 2^40 times 64 MiB)
        monkeypatch.setattr(kernelbench, "WHOLE_ROOM", room)
        (x,) = spec.make_inputs(3, 8192, "bfloat16", torch.Generator("cuda").manual_seed(0), "random", "cuda")
        assert x.shape == (3, 8192) and x.is_cuda and float(x.float().std()) > 0.5
        assert f.with_suffix(".where").read_text() == where


def test_a_product_that_leaves_float64s_range_part_way_is_taken_exactly() -> None:
    """The float64 reference of a product whose partials overflow beside partials that underflow
    (an fp32 kernel's 0 was judged wrong against float64's NaN): the product as float64 holds it;
    a genuine NaN (0 x inf) and a product past float64's range stay what they are."""
    from llmcompile.specs.kernelbench import Float64Casts

    x = torch.tensor(
        [[1e300, 1e300, 1e-300, 1e-300, -2.0], [0.0, torch.inf, 1.0, 1.0, 1.0], [1e200, 1e200, 1.0, 1.0, 3.0]],
        dtype=torch.float64,
    )
    assert torch.isinf(x.prod(1)[0])  # float64's own order: 1e300 * 1e300 is inf, then inf * 1e-300
    with Float64Casts():
        rows, whole, kept = torch.prod(x, 1), x[:1].prod(), x.prod(dim=-1, keepdim=True)
    assert rows[0].item() == pytest.approx(-2.0, rel=1e-12) and whole.item() == pytest.approx(-2.0, rel=1e-12)
    assert torch.isnan(rows[1]) and torch.isinf(rows[2]) and rows[2] > 0
    assert kept.shape == (3, 1) and kept[0, 0].item() == pytest.approx(-2.0, rel=1e-12)
    y = torch.randn(4, 8, dtype=torch.float64)
    with Float64Casts():
        inside = torch.prod(y, dim=1)
    assert torch.equal(inside, y.prod(1))  # finite: float64's own product, bit for bit


def test_rows_found_independent_by_another_process_are_not_checked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU worker takes the judge's answer: the check's runs on CPU (seconds at 3 rows of a
    16M-element problem) are paid once a problem, not once a process."""
    from llmcompile.specs import kernelbench
    from tests.level1 import problem_file

    f = problem_file(tmp_path, "s", "torch.cumsum(x, 0)", "(64, 32, 16)")
    found = get_op(str(f)).independent_rows
    assert found is False
    kernelbench._CACHE.clear()
    monkeypatch.setattr(kernelbench, "_independent_rows", lambda *a: pytest.fail("checked again"))
    assert kernelbench.load_problem(f, independent_rows=found).independent_rows is found
