"""CPU (CI): the judge's memory plan, known before the GPU allocates anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmcompile.harness.memplan import GIB, ProblemTooLarge, check_fits, plan, profile_bytes, verify_bytes
from llmcompile.specs import get_op, verify_shapes

LEVEL1 = Path(__file__).resolve().parents[2] / "shared" / "kernelbench" / "level1"
H100 = 79 * GIB


def test_builtin_grid_fits_an_h100_and_counts_what_it_allocates() -> None:
    spec = get_op("softmax")
    shapes = spec.shapes()
    check_fits(plan(spec, "float32", verify_shapes(spec), shapes), H100)
    moved = spec.bytes_moved(1 << 18, 1024, "float32")  # 2 GiB in, 2 GiB out
    # two rotated sets (each larger than 4x L2: outputs rotate against them) with their outputs, a
    # reference in chunks of rows; where two do not fit, one
    assert 2 * moved < profile_bytes(spec, "float32", 1 << 18, 1024) < 4 * moved
    assert moved < profile_bytes(spec, "float32", 1 << 18, 1024, least=True) < 3 * moved
    # verification: several copies and the whole float64 reference
    assert verify_bytes(spec, "float32", 4097, 1024) > 4 * spec.bytes_moved(4097, 1024, "float32")


def test_too_large_says_what_it_needs_and_what_the_gpu_has() -> None:
    spec = get_op("softmax")
    with pytest.raises(
        ProblemTooLarge, match=r"profile at M=1048576 N=16384 needs \d+\.\d GiB; the GPU has 79\.0 GiB"
    ) as e:
        check_fits(plan(spec, "float32", [], [(1 << 20, 1 << 14)]), H100)
    assert "h200" not in str(e.value)  # 200+ GiB: no GPU of ours holds it
    with pytest.raises(ProblemTooLarge, match="--target h200"):  # ~110 GiB would fit an H200
        check_fits(plan(spec, "float32", [], [(1 << 19, 1 << 14)]), H100)


@pytest.mark.skipif(not LEVEL1.is_dir(), reason="KernelBench level 1 not beside the checkout")
def test_level1_problems_at_their_own_size_fit_an_h100_or_say_why() -> None:
    """Verification is bounded for every problem; at their own sizes the timed runs fit 79 GiB."""
    from llmcompile.specs.kernelbench import load_dir

    specs, _ = load_dir(LEVEL1)
    needs = {}
    for spec in specs:
        stages = plan(spec, spec.dtypes[0], verify_shapes(spec), spec.shapes())
        needs[spec.name] = max(p.bytes for p in stages)
        if spec.batchable:  # a few rows (or a few million elements) whatever the problem's batch
            row = spec.bytes_moved(1, spec.shapes()[0][1], spec.dtypes[0])
            assert max(p.bytes for p in stages if p.stage == "verify") < max(8 * GIB, 40 * 3 * row), spec.name
    too_large = [name for name, b in needs.items() if b + GIB > H100]
    assert too_large == [], {n: needs[n] / GIB for n in too_large}


def test_attention_plan_counts_the_references_scores() -> None:
    """The float64 reference holds a block of scores beyond its inputs and outputs; the plan
    knows it, and attention's whole grid fits an H100 (verified at the timed sizes)."""
    spec = get_op("attention_causal")
    check_fits(plan(spec, "bfloat16", verify_shapes(spec), spec.shapes()), H100)
    plain = verify_bytes(get_op("softmax"), "bfloat16", 16, 16384)
    assert spec.reference_scratch == 3 * 8 * (1 << 26)
    assert verify_bytes(spec, "bfloat16", 16, 16384) > spec.reference_scratch > plain
