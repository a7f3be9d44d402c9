"""The pattern matcher's front end and dispatch on all 50 KernelBench level-1 files: each
matches its family or says why none does (no GPU). Each family's own tests (the graph's details
in its kernel, its tiling, what it does not take, its kernels compiled for sm_90a) are in
test_patterns_<family>.py; the matcher's fuzz in test_patterns_fuzz.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmcompile.agent import patterns
from llmcompile.harness.static import check_source
from llmcompile.specs import get_op
from tests.level1 import LEVEL1, needs_level1, problem_file

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


def test_builtins_and_unmatched_say_so(tmp_path: Path) -> None:
    assert isinstance(patterns.match(get_op("softmax")), patterns.NoMatch)
    f = problem_file(tmp_path, "sortish", "torch.sort(x, dim=1)[0]", "(8, 64)")
    m = patterns.match(get_op(str(f)))
    assert isinstance(m, patterns.NoMatch) and "sort" in m.reason


@pytest.mark.parametrize(
    "read, constant",
    [
        ("x.sum(-1) / x.shape[-1]", "x.sum(-1) / 1024"),
        ("x.sum(1) / x.size(1)", "x.sum(1) / 16"),
        (
            "x.pow(2).mean(-1, keepdim=True) * x.size()[2] / (x.shape[1] * x.shape[2])",
            "x.pow(2).mean(-1, keepdim=True) * 1024 / 16384",
        ),
        ("x.amax(-1) * x.dim() + x.ndim", "x.amax(-1) * 3 + 3"),
        ("x.sum(-1) / self.w.shape[0]", "x.sum(-1) / 1024"),
    ],
)
def test_a_shape_read_is_the_constant_it_is(read: str, constant: str, tmp_path: Path) -> None:
    init = "self.w = nn.Parameter(torch.rand(1024))"
    ms = []
    for d, forward in (("a", read), ("b", constant)):
        (tmp_path / d).mkdir()
        ms.append(patterns.match(get_op(str(problem_file(tmp_path / d, "p", forward, "(8, 16, 1024)", init)))))
    assert all(isinstance(m, patterns.Match) for m in ms) and ms[0].source == ms[1].source, ms


def test_a_problem_of_one_size_reads_its_batch_dim_as_that_size(tmp_path: Path) -> None:
    import operator

    from torch import fx

    from llmcompile.agent.patterns.graph import fold_shape_reads
    from llmcompile.specs.kernelbench import model_of

    init = "self.w = nn.Parameter(torch.rand(8, 16, 1024))"  # (x * w: only at x's own batch of 8)
    spec = get_op(str(problem_file(tmp_path, "p", "(x * self.w).sum(-1) / x.shape[0]", "(8, 16, 1024)", init)))
    model, given = model_of(spec)
    gm = fx.symbolic_trace(model)
    fold_shape_reads(gm, spec, given)
    (div,) = [n for n in gm.graph.nodes if n.target is operator.truediv]
    assert not spec.batchable and div.args[1] == 8 and not any(n.target is getattr for n in gm.graph.nodes)


@pytest.mark.parametrize(
    "forward, reason",
    [
        ("x.sum(0) / x.shape[0]", "`x.shape[0]`: the batch dim's size, known only at run time"),
        ("x.sum(-1) / x.size(0)", "the batch dim's size"),
        ("x.sum(-1) * x.shape[:2][1]", "`x.shape[:2]`: the batch dim's size"),
        # a view that regroups x other than by merging its dims (patterns/lift.py reads those in x's
        # dims): a template would read the view's dims as x's (it wrote a kernel of x.sum(1) for
        # x.reshape(-1, 1024).sum(-1), of dim 3 of 3 for the second)
        ("x.reshape(-1, 512).sum(-1)", "`sum` of a view that regroups its input, (8, 16, 1024) as (256, 512)"),
        ("x.unsqueeze(1).sum(2)", "a view that regroups its input"),
        ("x.view(8, 16, 32, 32).sum(-1, keepdim=True)", "a view that regroups its input"),
        ("torch.var_mean(x.view(8, 16, 32, 32), dim=(0, 2, 3))", "a view that regroups its input"),
    ],
)
def test_what_a_template_would_misread_is_refused(forward: str, reason: str, tmp_path: Path) -> None:
    m = patterns.match(get_op(str(problem_file(tmp_path, "p", forward, "(8, 16, 1024)"))))
    assert isinstance(m, patterns.NoMatch) and reason in m.reason, m


def test_a_level1_run_out_of_gpu_memory_runs_again_alone() -> None:
    """The GPU tests share the GPU among workers: a run that found its memory taken by the
    others' runs again once, holding the lock they share, and its own failure still fails."""
    import fcntl

    import torch

    from tests.level1 import MEMORY_LOCK, sharing_gpu_memory

    tries: list[bool] = []

    def body() -> None:
        with open(MEMORY_LOCK) as f:  # may another worker's run start now? (not while we hold it alone)
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
                fcntl.flock(f, fcntl.LOCK_UN)
                alone = False
            except BlockingIOError:
                alone = True
        tries.append(alone)
        if len(tries) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory (test)")

    sharing_gpu_memory(body)
    assert tries == [False, True]

    def wrong() -> None:
        raise AssertionError("a wrong kernel")

    with pytest.raises(AssertionError, match="a wrong kernel"):
        sharing_gpu_memory(wrong)
