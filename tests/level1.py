"""KernelBench level-1 problems for the pattern tests: where the files are, one by number, a
small problem file of a test's own, and a matched kernel compiled for sm_90a (no GPU)."""

from __future__ import annotations

import contextlib
import fcntl
import gc
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from llmcompile.agent import patterns
from llmcompile.specs import OpSpec, contract, get_op

# a KernelBench checkout's level1 folder, else the shared one beside this checkout
LEVEL1 = Path(os.environ.get("KERNELBENCH_LEVEL1", Path(__file__).resolve().parents[2] / "shared/kernelbench/level1"))
needs_level1 = pytest.mark.skipif(not LEVEL1.is_dir(), reason=f"KernelBench level 1 not beside the checkout ({LEVEL1})")


# The level-1 problems run at their real size (GBs a tensor) while the other test workers share
# the GPU: they share a lock, and one the GPU's memory ran out under takes it alone to run again.
MEMORY_LOCK = Path(tempfile.gettempdir()) / "llmcompile-tests-gpu-memory.lock"


@contextlib.contextmanager
def _locked(mode: int) -> Iterator[None]:
    with open(MEMORY_LOCK, "a") as f:
        fcntl.flock(f, mode)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def sharing_gpu_memory(body: Callable[[], None]) -> None:
    """`body()` beside the other workers' level-1 runs; where the GPU ran out of memory under
    them, once more with the lock to itself (the others wait), so a test fails for its kernel,
    never for its neighbours' allocations."""
    import torch

    with _locked(fcntl.LOCK_SH):
        try:
            return body()
        except torch.OutOfMemoryError:
            pass
    gc.collect()
    torch.cuda.empty_cache()
    with _locked(fcntl.LOCK_EX):
        return body()


def problem(num: int) -> OpSpec:
    (path,) = LEVEL1.glob(f"{num}_*.py")
    return get_op(str(path))


def source(num: int) -> str:
    """The kernel the matcher writes for level-1 problem `num`."""
    m = patterns.match(problem(num))
    assert isinstance(m, patterns.Match), m
    return m.source


def problem_file(tmp_path: Path, name: str, forward: str, shape: str, init: str = "pass") -> Path:
    """A KernelBench-format file: `init` in Model.__init__, forward(x) returning `forward`, an
    input of torch.rand`shape`."""
    f = tmp_path / f"{name}.py"
    f.write_text(
        "import torch\nfrom torch import nn\n\nclass Model(nn.Module):\n    def __init__(self):\n"
        f"        super().__init__()\n        {init}\n    def forward(self, x):\n        return {forward}\n\n"
        f"def get_inputs():\n    return [torch.rand{shape}]\n\ndef get_init_inputs():\n    return []\n"
    )
    return f


def compiled_match(src: Path, dtype: str, tmp_path: Path, pattern: str | None = None) -> tuple[patterns.Match, int]:
    """The kernel the matcher writes for the problem file `src` (of family `pattern` where
    given), compiled for sm_90a at the problem's own N with the workspace it asks for; returns
    the match and that workspace."""
    spec = get_op(str(src))
    m = patterns.match(spec)
    assert isinstance(m, patterns.Match) and (pattern is None or m.pattern == pattern), m
    path = tmp_path / f"k_{src.stem}.py"
    path.write_text(m.source)
    mod = contract.load_module(path)
    (_, n) = spec.fixed_shapes[0]
    ws = contract.workspace_of(mod)
    assert contract.compile_entry(contract.entry_of(mod), spec, dtype, n, workspace=ws) is not None
    return m, ws


def compiles(num: int, tmp_path: Path, pattern: str) -> None:
    """Level-1 problem `num` matches `pattern`, and its kernel compiles for sm_90a at the
    problem's own N, asking for a workspace exactly where its partials cross CTAs."""
    (path,) = LEVEL1.glob(f"{num}_*.py")
    m, ws = compiled_match(path, problem(num).dtypes[0], tmp_path, pattern)
    assert (ws > 0) == (m.pattern in ("total", "norm"))


def verify_runs(spec: OpSpec, source: str, dtype: str, tmp_path: Path, seed: int, cases: tuple[str, ...] = ()):
    """At each of the judge's verify shapes, the kernel `source` run once (on the GPU) on fresh
    random inputs into poisoned outputs, then on the generic `cases` made from them (spikes at
    every edge, ...: specs/inputs.py) where they apply: yields (M, N, fn, inputs, outputs)."""
    import torch

    from llmcompile.harness.verify import poison
    from llmcompile.specs import verify_shapes
    from llmcompile.specs.inputs import generic_inputs

    path = tmp_path / "k.py"
    path.write_text(source)
    mod = contract.load_module(path)
    entry, ws = contract.entry_of(mod), contract.workspace_of(mod)
    gen = torch.Generator().manual_seed(seed)
    for mm, n in verify_shapes(spec):
        fn = contract.with_workspace(contract.compile_entry(entry, spec, dtype, n, workspace=ws), len(spec.tensors), ws)
        random = spec.make_inputs(mm, n, dtype, gen, "random", "cuda")
        for ins in [random] + [generic_inputs(c, random, gen) for c in cases]:
            if ins is None:
                continue
            outs = spec.alloc_outputs(mm, n, dtype, "cuda")
            poison(outs)
            fn(*ins, *outs, *spec.scalars.values())
            torch.cuda.synchronize()
            yield mm, n, fn, ins, outs


def right_on_gpu(src: Path, dtype: str, tmp_path: Path, seed: int, kernelbench: bool = False) -> None:
    """The kernel the matcher writes for the problem file `src`, on the GPU against the float64
    reference at each of the judge's verify shapes (fresh random inputs and the generic cases
    made from them, as the judge verifies; poisoned outputs). `kernelbench`: also KernelBench's
    check, allclose to the problem's own torch output in its dtype, on every one of those inputs."""
    from llmcompile.harness.verify import KernelBenchTally, compare
    from llmcompile.specs.inputs import GENERIC_CASES

    spec = get_op(str(src))
    m = patterns.match(spec)
    assert isinstance(m, patterns.Match), m
    for mm, n, _, ins, outs in verify_runs(spec, m.source, dtype, tmp_path, seed, GENERIC_CASES):
        tally = KernelBenchTally()
        bad = compare(spec, dtype, ins, outs, tally=tally if kernelbench else None)
        assert bad is None, f"{m.pattern} kernel of {src.name}, M={mm} N={n}: {bad.describe()}"
        if kernelbench:
            assert (tally.checked, tally.passed) == (1, 1), (
                f"{m.pattern} kernel of {src.name}, M={mm} N={n}: KernelBench's check failed"
            )
