"""The pattern matcher on all 50 KernelBench level-1 files, and every template's kernels
compiled for sm_90a from the sources the matcher writes (no GPU)."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

from llmcompile import contract, patterns
from llmcompile.harness.static import check_source
from llmcompile.ops import get_op

# a KernelBench checkout's level1 folder, else the shared one beside this checkout
LEVEL1 = Path(os.environ.get("KERNELBENCH_LEVEL1", Path(__file__).resolve().parents[2] / "shared/kernelbench/level1"))
needs_level1 = pytest.mark.skipif(not LEVEL1.is_dir(), reason=f"KernelBench level 1 not beside the checkout ({LEVEL1})")

EXPECTED = {
    "map": [5, 12, 19, 20, 21, 22, 25, 26, 27, 28, 29, 30, 31, 32, 88],
    "softmax": [23],
    "log_softmax": [24],
    "strided": [36, 47, 48, 49, 51, 52, 53],
    "scan": [89, 90, 91, 92, 93],
    "total": [37, 94, 96, 98, 100],
    "norm": [33, 34, 35, 38, 39, 40],
    "pool": [41, 42, 43, 44, 45, 46],
}


def _problem(num: int):
    (path,) = LEVEL1.glob(f"{num}_*.py")
    return get_op(str(path))


@needs_level1
def test_every_file_matches_or_says_why() -> None:
    expected = {n: pattern for pattern, nums in EXPECTED.items() for n in nums}
    for path in sorted(LEVEL1.glob("*.py")):
        num = int(path.name.split("_")[0])
        m = patterns.match(get_op(str(path)))
        if num in expected:
            assert isinstance(m, patterns.Match) and m.pattern == expected[num], (path.name, m)
            assert check_source(m.source).ok, (path.name, check_source(m.source).problems)
        else:
            assert isinstance(m, patterns.NoMatch) and m.reason.startswith("no template"), (path.name, m)


@needs_level1
def test_graph_details_reach_the_kernel() -> None:
    src = patterns.match(_problem(91)).source
    assert "reverse=True" in src and "exclusive=False" in src
    assert "exclusive=True" in patterns.match(_problem(92)).source
    assert "cutlass.select_(v[1]" in patterns.match(_problem(93)).source  # the bool mask
    assert "S.mul" in patterns.match(_problem(90)).source
    m = patterns.match(_problem(36))
    assert "def rewrite" in m.source and "0.015625" in m.source  # mean over 64 channels
    assert "S.argmax" in patterns.match(_problem(51)).source
    assert "acc[1]" in patterns.match(_problem(52)).source  # the index, not the value
    assert "negative_slope" not in patterns.match(_problem(20)).source  # torch's default kept implicit
    assert "alpha=" not in patterns.match(_problem(31)).source
    five = patterns.match(_problem(5)).source
    assert "arg1: cutlass.Float32" in five and "(in0 * arg1)" in five  # the scalar stays a runtime value
    assert "('row', 'full')" in patterns.match(_problem(12)).source
    hinge = patterns.match(_problem(100)).source  # targets broadcast along the last dim
    assert "('full', 'col')" in hinge and "cute.arch.fmax((1.0 - (in0 * in1)), Float32(0.0))" in hinge
    kl = patterns.match(_problem(98)).source  # batchmean: over the rows, 0 where the target is 0
    assert "acc[0] / rows" in kl and "cutlass.select_(in1 > 0.0" in kl
    assert "acc[0] / count" in patterns.match(_problem(94)).source  # a mean over every element
    fro = patterns.match(_problem(37))
    assert "cute.math.sqrt(acc[0])" in fro.source and "return (x / s[0])" in fro.source
    assert "WORKSPACE = T.WORKSPACE" in fro.source


@needs_level1
def test_knob_variants_render() -> None:
    spec = _problem(19)
    m = patterns.match(spec)
    assert "M.MapKnobs(unroll=8)" in patterns.render(spec, m, "unroll=8")


def test_builtins_and_unmatched_say_so(tmp_path: Path) -> None:
    assert isinstance(patterns.match(get_op("softmax")), patterns.NoMatch)
    f = tmp_path / "sortish.py"
    f.write_text(
        "import torch\nfrom torch import nn\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
        "        return torch.sort(x, dim=1)[0]\n\ndef get_inputs():\n    return [torch.rand(8, 64)]\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    m = patterns.match(get_op(str(f)))
    assert isinstance(m, patterns.NoMatch) and "sort" in m.reason


COMPILED = [5, 12, 19, 88, 36, 48, 51, 89, 91, 92, 93, 37, 94, 96, 98, 100, 33, 34, 35, 38, 40, 41, 43, 45]


@needs_level1
@pytest.mark.parametrize("num", COMPILED)
def test_template_kernels_compile_for_sm90a(num: int, tmp_path: Path) -> None:
    spec = _problem(num)
    m = patterns.match(spec)
    path = tmp_path / f"k{num}.py"
    path.write_text(m.source)
    mod = contract.load_module(path)
    (_, n) = spec.fixed_shapes[0]
    ws = contract.workspace_of(mod)
    assert (ws > 0) == (m.pattern in ("total", "norm"))  # partials across CTAs need scratch
    assert contract.compile_entry(contract.entry_of(mod), spec, spec.dtypes[0], n, workspace=ws) is not None


def test_templates_import_and_allow_knobs() -> None:
    for name in ("map", "strided", "scan", "total"):
        mod = importlib.import_module(f"reference_kernels.{name}")
        assert mod.__doc__
    from reference_kernels import map as M
    from reference_kernels import scan as S
    from reference_kernels import strided as R

    assert M.resolve_tiling(M.MapKnobs(), 32, 4095).vec == 1
    assert M.resolve_tiling(M.MapKnobs(), 32, 393216).vec == 4
    assert R.resolve_tiling(R.StridedKnobs(), 32, 64, 262144, rewrite=True).vec == 1  # 64 values held
    assert R.resolve_tiling(R.StridedKnobs(), 32, 4096, 4095, rewrite=False).threads_r == 4
    t = S.resolve_tiling(S.ScanKnobs(), 32, 32768)
    assert (t.vec, t.chunk, t.chunks) == (4, 4096, 8)
    assert S.resolve_tiling(S.ScanKnobs(), 32, 100).num_threads < 256  # a short row uses fewer threads
    with pytest.raises(ValueError):
        M.resolve_tiling(M.MapKnobs(num_threads=100), 32, 4096)
    from reference_kernels import total as T

    assert T.resolve_tiling(T.TotalKnobs(), 32, 32768).vec == 4
    assert T.resolve_tiling(T.TotalKnobs(), 32, 4095).vec == 1  # a "col" operand's vector stays contiguous
    with pytest.raises(ValueError):
        T.resolve_tiling(T.TotalKnobs(ctas=T.MAX_CTAS + 1), 32, 4096)


def test_an_l1_norm_over_a_middle_dim_is_a_plain_sum(tmp_path: Path) -> None:
    """p=1 sums |x| and takes no root (the strided matcher once took the 2-norm's sqrt for it)."""
    f = tmp_path / "l1mid.py"
    f.write_text(
        "import torch\nfrom torch import nn\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
        "        return torch.norm(x, p=1, dim=1)\n\ndef get_inputs():\n    return [torch.rand(8, 64, 32)]\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    m = patterns.match(get_op(str(f)))
    assert isinstance(m, patterns.Match) and m.pattern == "strided"
    assert "cute.math.abs(x)" in m.source and "sqrt" not in m.source
