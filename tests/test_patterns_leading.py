"""The leading family: one reduction over the batch dim (or the leading dims together), whose
length is known only at run time, R split over CTAs through a workspace, with a prologue, an
epilogue and, for a norm or a softmax, a rewrite of the input (patterns/strided.py ->
prompts/candidates/leading.py.j2 -> reference_kernels/leading.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmcompile.agent import patterns
from llmcompile.specs import get_op
from tests.level1 import compiled_match, problem_file, right_on_gpu


def test_tiling() -> None:
    from reference_kernels import leading as L
    from reference_kernels.reduce import pick
    from reference_kernels.tuning import strided as T

    ws = L.workspace_elems(8192, 1)
    wide = L.resolve_tiling(L.LeadingKnobs(), 32, 8192, 1, ws)
    # few columns: R over 32 threads of a CTA, then over CTAs until the GPU is full
    assert (
        wide.threads_r == pick(T.LEADING_MAX_THREADS_R, 1) == 32
        and wide.col_tiles * wide.splits >= T.LEADING_TARGET_CTAS
    )
    # many columns fill the GPU alone: one CTA along R, no partial crossing CTAs but the final fold's
    many = L.resolve_tiling(L.LeadingKnobs(), 32, 3 << 19, 1, L.workspace_elems(3 << 19, 1))
    assert (many.threads_r, many.splits) == (1, 1)
    with pytest.raises(ValueError, match="workspace holds"):
        L.resolve_tiling(L.LeadingKnobs(splits=T.LEADING_MAX_SPLITS + 1), 32, 8192, 1, ws)
    with pytest.raises(ValueError, match="columns"):
        L.workspace_elems(1 << 22, 3)
    # a Chan merge (3 values) spreads R over at most 16 threads (T.LEADING_MAX_THREADS_R),
    # more CTAs instead; a knob given wins
    chan = L.resolve_tiling(L.LeadingKnobs(), 16, 8192, 3, L.workspace_elems(8192, 3))
    given = L.resolve_tiling(L.LeadingKnobs(threads_r=32), 16, 8192, 3, L.workspace_elems(8192, 3))
    assert (chan.threads_r, given.threads_r) == (16, 32) and chan.col_tiles * chan.splits >= T.LEADING_TARGET_CTAS


LEADING = [
    ("sum", "torch.sum(x, dim=0)", "(64, 32, 256)"),
    ("mean keepdim", "x.mean(dim=0, keepdim=True)", "(64, 32, 256)"),
    ("amax", "torch.amax(x, dim=0)", "(64, 32, 256)"),
    ("min values, an odd column count", "torch.min(x, dim=0)[0]", "(64, 32, 255)"),
    ("argmax", "torch.argmax(x, dim=0)", "(64, 32, 256)"),
    ("max and its index, two outputs", "torch.max(x, dim=0)", "(64, 32, 256)"),
    ("prod of a scaled input", "torch.prod(1.0 + x * 0.01, dim=0)", "(64, 32, 256)"),
    ("var", "torch.var(x, dim=0)", "(64, 32, 256)"),
    ("std biased", "torch.std(x, dim=0, unbiased=False)", "(64, 32, 256)"),
    ("logsumexp", "torch.logsumexp(x, dim=0)", "(64, 32, 256)"),
    ("norm p=2", "torch.linalg.vector_norm(x, dim=0)", "(64, 32, 256)"),
    ("two leading dims", "x.sum(dim=(0, 1))", "(64, 32, 256)"),
    ("x / its column norm", "x / torch.norm(x, dim=0, keepdim=True)", "(64, 32, 256)"),
    ("softmax", "torch.softmax(x, dim=0)", "(64, 32, 256)"),
    ("log_softmax", "torch.log_softmax(x, dim=0)", "(64, 32, 256)"),
]


@pytest.mark.parametrize(("what", "forward", "shape"), LEADING)
def test_a_reduction_over_the_batch_dim_compiles_for_sm90a(what: str, forward: str, shape: str, tmp_path: Path) -> None:
    """Every reduction over dim 0 is the leading template's, with R read at run time: a mean
    divides by the R it is given, not the problem's own."""
    m, ws = compiled_match(problem_file(tmp_path, "lead", forward, shape), "bfloat16", tmp_path, "leading")
    assert ws > 0 and "L.LeadingReduce" in m.source
    if what.startswith("mean"):
        assert "(Float32(1.0) / r)" in m.source and "0.015625" not in m.source


def test_every_dim_by_name_is_the_whole_tensor(tmp_path: Path) -> None:
    """A reduction over every dim, named, is the whole-tensor template's, as with no dim."""
    for forward in ("x.sum(dim=(0, 1))", "torch.var(x, dim=(0, 1))"):
        m = patterns.match(get_op(str(problem_file(tmp_path, "all", forward, "(64, 32)"))))
        assert isinstance(m, patterns.Match) and m.pattern == "total", forward


@pytest.mark.gpu
@pytest.mark.parametrize(("what", "forward", "shape"), LEADING)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_reduction_over_the_batch_dim_is_right(
    what: str, forward: str, shape: str, dtype: str, tmp_path: Path
) -> None:
    """The same kernels on the GPU against the float64 reference at each of the judge's verify
    shapes (other batch sizes than the problem's: R changes under the compiled kernel)."""
    big = shape.replace("(64, ", "(4096, ").replace(")", f", dtype=torch.{dtype})")
    right_on_gpu(problem_file(tmp_path, "lead", forward, big), dtype, tmp_path, 5)
