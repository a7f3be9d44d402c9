"""The pattern matcher on all 50 KernelBench level-1 files, and every template's kernels
compiled for sm_90a from the sources the matcher writes (no GPU)."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

from llmcompile.agent import patterns
from llmcompile.harness.static import check_source
from llmcompile.specs import contract, get_op

# a KernelBench checkout's level1 folder, else the shared one beside this checkout
LEVEL1 = Path(os.environ.get("KERNELBENCH_LEVEL1", Path(__file__).resolve().parents[2] / "shared/kernelbench/level1"))
needs_level1 = pytest.mark.skipif(not LEVEL1.is_dir(), reason=f"KernelBench level 1 not beside the checkout ({LEVEL1})")

EXPECTED = {
    "map": [5, 12, 19, 20, 21, 22, 25, 26, 27, 28, 29, 30, 31, 32, 88],
    "softmax": [23],
    "log_softmax": [24],
    "strided": [36, 47, 48, 49, 51, 52, 53],
    "scan": [89, 90, 91, 92, 93],
    "total": [37, 94, 95, 96, 98, 99, 100],
    "norm": [4, 33, 34, 35, 38, 39, 40],
    "pool": [41, 42, 43, 44, 45, 46],
    "attention_tf32": [97],
}


def _problem(num: int):
    (path,) = LEVEL1.glob(f"{num}_*.py")
    return get_op(str(path))


def _problem_file(tmp_path: Path, name: str, forward: str, shape: str, init: str = "pass") -> Path:
    """A KernelBench-format file: `init` in Model.__init__, forward(x) returning `forward`, an
    input of torch.rand`shape`."""
    f = tmp_path / f"{name}.py"
    f.write_text(
        "import torch\nfrom torch import nn\n\nclass Model(nn.Module):\n    def __init__(self):\n"
        f"        super().__init__()\n        {init}\n    def forward(self, x):\n        return {forward}\n\n"
        f"def get_inputs():\n    return [torch.rand{shape}]\n\ndef get_init_inputs():\n    return []\n"
    )
    return f


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
    bn = patterns.match(_problem(33)).source  # a channel over the batch: segments of H*W
    assert '"segments",\n    64,\n    262144,\n    1,\n    262144,' in bn and "N.mean_rstd(1e-05)" in bn
    gn = patterns.match(_problem(35)).source  # 8 channels a group; a weight per channel
    assert '"groups",\n    8,\n    2097152,\n    8,\n    262144,' in gn and "* p[0] + p[1]" in gn
    ln = patterns.match(_problem(40)).source  # a weight per normalized element
    assert '"groups",\n    1,\n    4194304,\n    0,\n    1,' in ln
    assert "(x - s[0]) * s[1]\n" in patterns.match(_problem(34)).source  # no affine
    l1 = patterns.match(_problem(38)).source
    assert "cute.math.abs(x)" in l1 and "acc[0] * 1.5259021896696422e-05" in l1 and "(x / s[0])" in l1
    assert "cute.math.sqrt(acc[0])" in patterns.match(_problem(39)).source
    ce = patterns.match(_problem(95)).source  # the rows' losses into the workspace, then their mean
    assert "CE.launch(x, target, losses" in ce and "acc[0] / acc[1]" in ce and "IGNORE_INDEX = -100" in ce
    tl = patterns.match(_problem(99)).source  # rows of (anchor, positive, negative), then the mean
    assert 'param_kinds=("full", "full")' in tl and "MARGIN, EPS = 1.0, 1e-06" in tl and "acc[0] / count" in tl
    mv = patterns.match(_problem(4)).source  # rows folded with the vector, a value a row
    assert "weighted=True" in mv and "(x * p[0],)" in mv and "apply = None" in mv and "(in0, (in1,), out" in mv
    mp1 = patterns.match(_problem(41)).source
    assert '"max"' in mp1 and "padding=4" in mp1 and "dilation=3" in mp1
    ap2 = patterns.match(_problem(45)).source  # stride defaults to the kernel
    assert '"avg"' in ap2 and "kernel=11" in ap2 and "stride=11" in ap2 and "count_include_pad=True" in ap2


@needs_level1
def test_knob_variants_render() -> None:
    spec = _problem(19)
    m = patterns.match(spec)
    assert "M.MapKnobs(unroll=8)" in patterns.render(spec, m, "unroll=8")


def test_builtins_and_unmatched_say_so(tmp_path: Path) -> None:
    assert isinstance(patterns.match(get_op("softmax")), patterns.NoMatch)
    f = _problem_file(tmp_path, "sortish", "torch.sort(x, dim=1)[0]", "(8, 64)")
    m = patterns.match(get_op(str(f)))
    assert isinstance(m, patterns.NoMatch) and "sort" in m.reason


COMPILED = [5, 12, 19, 88, 36, 48, 51, 89, 91, 92, 93, 37, 94, 96, 98, 100, 4, 33, 34, 35, 38, 40, 41, 43, 45, 95, 99, 97]  # fmt: skip


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
    scalar = R.resolve_tiling(R.StridedKnobs(), 32, 4096, 4095, rewrite=False)  # an odd inner dim
    assert (scalar.vec, scalar.num_threads, scalar.threads_r) == (1, R.SCALAR_THREADS, 8)
    assert R.resolve_tiling(R.StridedKnobs(), 32, 64, 4095, rewrite=True).num_threads == 256
    assert R.resolve_tiling(R.StridedKnobs(), 32, 4096, 4096, rewrite=False).threads_r == 4
    t = S.resolve_tiling(S.ScanKnobs(), 32, 32768)
    assert (t.vec, t.chunk, t.chunks) == (4, 1024, 32)
    assert S.resolve_tiling(S.ScanKnobs(), 32, 100).num_threads < 256  # a short row uses fewer threads
    with pytest.raises(ValueError):
        M.resolve_tiling(M.MapKnobs(num_threads=100), 32, 4096)
    from reference_kernels import total as T

    assert T.resolve_tiling(T.TotalKnobs(), 32, 32768).vec == 4
    assert T.resolve_tiling(T.TotalKnobs(), 32, 4095).vec == 1  # a "col" operand's vector stays contiguous
    # a CTA walks one range where it rereads a "col" operand (from its L1), else the grid strides
    assert T.resolve_tiling(T.TotalKnobs(), 32, 4096, ("full", "col")).contiguous
    assert not T.resolve_tiling(T.TotalKnobs(), 32, 4096, ("full", "full")).contiguous
    assert not T.resolve_tiling(T.TotalKnobs(contiguous=False), 32, 4096, ("full", "col")).contiguous
    with pytest.raises(ValueError):
        T.resolve_tiling(T.TotalKnobs(ctas=T.MAX_CTAS + 1), 32, 4096)


def test_norm_and_pool_shapes_follow_torch() -> None:
    import torch

    from reference_kernels import norm as N
    from reference_kernels import pool as P

    assert N.resolve_tiling(N.NormKnobs(), 32, 65535, "groups").vec == 1  # an odd row: scalar loads
    assert N.resolve_tiling(N.NormKnobs(), 32, 4096, "groups").fused
    assert not N.resolve_tiling(N.NormKnobs(), 32, 4096, "segments").fused
    with pytest.raises(ValueError):
        N.GroupedNorm(N.shifted_moments, None, (0.0, 0.0, 0.0), None, None, "groups", 1, 8)  # arity 3
    # the output sizes torch gives, dilation and padding included
    for size, k, s, p, d in [
        ((37,), 8, 1, 4, 3),
        ((33, 40), 4, 1, 1, 1),
        ((9, 17, 20), 3, 2, 1, 3),
        ((64, 64), 11, 11, 0, 1),
    ]:
        x = torch.zeros(1, 1, *size)
        pool = {1: torch.nn.MaxPool1d, 2: torch.nn.MaxPool2d, 3: torch.nn.MaxPool3d}[len(size)]
        want = pool(k, s, p, d)(x).shape[2:]
        got = P.resolve_shape(P.PoolKnobs(), size, k, s, p, d).out
        assert got[3 - len(size) :] == tuple(want)
    sh = P.resolve_shape(P.PoolKnobs(), (64, 64), 4, 1, 1, 1)
    assert sh.rows == 4 and sh.row_offsets() == list(range(7))  # 7 input rows serve 4 output rows
    assert P.resolve_shape(P.PoolKnobs(), (64, 64), 11, 11, 0, 1).rows == 1  # no overlap: nothing to share
    assert P.resolve_shape(P.PoolKnobs(), (8, 8, 62), 3, 2, 1, 3).num_threads == 32  # a narrow row, a narrow CTA
    with pytest.raises(ValueError):
        P.resolve_shape(P.PoolKnobs(), (8,), 3, 1, 2, 1)  # padding over half the window


def test_pooling_and_norms_that_the_templates_do_not_take_say_why(tmp_path: Path) -> None:
    ceil = _problem_file(tmp_path, "ceil", "self.p(x)", "(4, 3, 16, 16)", "self.p = nn.MaxPool2d(3, 2, ceil_mode=True)")
    assert "ceil_mode" in patterns.match(get_op(str(ceil))).reason
    frozen = _problem_file(tmp_path, "frozen", "self.bn(x)", "(4, 3, 8, 8)", "self.bn = nn.BatchNorm2d(3).eval()")
    assert "eval mode" in patterns.match(get_op(str(frozen))).reason
    rowsum = _problem_file(tmp_path, "rowsum", "torch.sum(x, dim=-1)", "(4, 3, 8)")
    assert "without a rewrite" in patterns.match(get_op(str(rowsum))).reason


def test_an_l1_norm_over_a_middle_dim_is_a_plain_sum(tmp_path: Path) -> None:
    """p=1 sums |x| and takes no root (the strided matcher once took the 2-norm's sqrt for it)."""
    f = _problem_file(tmp_path, "l1mid", "torch.norm(x, p=1, dim=1)", "(8, 64, 32)")
    m = patterns.match(get_op(str(f)))
    assert isinstance(m, patterns.Match) and m.pattern == "strided"
    assert "cute.math.abs(x)" in m.source and "sqrt" not in m.source


def _attention_file(tmp_path: Path, name: str, call: str, shape: str, dtype: str = "torch.float32") -> Path:
    f = tmp_path / f"{name}.py"
    f.write_text(
        "import torch\nimport torch.nn.functional as F\nfrom torch import nn\n\nclass Model(nn.Module):\n"
        f"    def forward(self, q, k, v):\n        return {call}\n\n"
        f"def get_inputs():\n    return [torch.rand{shape}.to({dtype}) for _ in range(3)]\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    return f


def test_attention_matches_only_what_the_fp32_kernel_computes(tmp_path: Path) -> None:
    """SDPA with a scale of its own reaches the kernel; a mask, causality, another dtype or a
    shape the kernel does not take is not attempted, and says which."""
    plain = _attention_file(tmp_path, "a", "F.scaled_dot_product_attention(q, k, v, scale=0.5)", "(2, 4, 128, 256)")
    m = patterns.match(get_op(str(plain)))
    assert isinstance(m, patterns.Match) and m.pattern == "attention_tf32" and "SCALE = 0.5" in m.source
    default = patterns.match(
        get_op(str(_attention_file(tmp_path, "b", "F.scaled_dot_product_attention(q, k, v)", "(2, 4, 128, 256)")))
    )
    assert "SCALE = 0.0625" in default.source  # 1 / sqrt(256)
    for name, call, shape, dtype, why in [
        (
            "c",
            "F.scaled_dot_product_attention(q, k, v, is_causal=True)",
            "(2, 4, 128, 256)",
            "torch.float32",
            "is_causal",
        ),
        ("d", "F.scaled_dot_product_attention(q, k, v)", "(2, 4, 1024, 256)", "torch.float32", "at most 512"),
        ("e", "F.scaled_dot_product_attention(q, k, v)", "(2, 4, 128, 96)", "torch.float32", "head dim 96"),
        ("f", "F.scaled_dot_product_attention(q, k, v)", "(2, 4, 128, 256)", "torch.bfloat16", "fp32"),
    ]:
        m = patterns.match(get_op(str(_attention_file(tmp_path, name, call, shape, dtype))))
        assert isinstance(m, patterns.NoMatch) and why in m.reason, (name, m)


@needs_level1
def test_attention_problem_prompt_carries_the_fp32_kernel() -> None:
    from llmcompile.agent.prompting import PromptContext, task_prompt
    from llmcompile.specs.targets import get_target

    text = task_prompt(PromptContext(_problem(97), "float32", get_target("h100"), 90.0))
    assert "class AttentionTf32" in text and "A.launch(_heads(in0)" in text
