"""Suite files: the shipped membound suite loads; bad suites give clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmcompile.suites.suite import SuiteError, load_suite

ROOT = Path(__file__).resolve().parents[1]


def test_membound_suite_covers_the_issue() -> None:
    s = load_suite(ROOT / "evals/suites/membound.toml")
    ids = {p.id for p in s.problems}
    for op in (
        *("softmax", "log_softmax", "rmsnorm", "layernorm", "cross_entropy"),
        *("softmax_bwd", "log_softmax_bwd", "cross_entropy_fwd", "cross_entropy_bwd"),
    ):
        assert {f"{op}-bf16", f"{op}-fp32"} <= ids
    custom = [p for p in s.problems if p.custom]
    assert len(custom) >= 5 and all(Path(p.op).is_file() for p in custom)
    assert s.target == "h100" and {"eager", "compile"} <= set(s.baselines)
    assert all(p.budget.rounds > 0 and p.budget.samples > 0 for p in s.problems)


def test_attention_suite_is_rated_against_the_tensor_cores(tmp_path: Path) -> None:
    s = load_suite(ROOT / "evals/suites/attention.toml")
    ids = {p.id for p in s.problems}
    assert {"attention-bf16", "attention-fp16", "attention_causal-bf16", "attention_causal_d64-bf16"} <= ids
    assert s.baselines == ("sdpa_flash", "sdpa_cudnn", "fa4") and all(p.budget.target_sol == 75 for p in s.problems)
    bad = _suite(tmp_path, 'baselines = ["fa5"]\n[[problem]]\nop = "attention"\n')
    with pytest.raises(SuiteError, match="unknown baselines \\['fa5'\\]; known: eager"):
        load_suite(bad)
    with pytest.raises(SuiteError, match="attention does not take float32"):
        load_suite(_suite(tmp_path, '[[problem]]\nop = "attention"\ndtypes = ["float32"]\n'))


def test_smoke_suite_is_small() -> None:
    s = load_suite(ROOT / "evals/suites/smoke.toml")
    assert len(s.problems) == 5 and sum(p.custom for p in s.problems) == 1
    assert all(p.budget.rounds == 1 for p in s.problems) and s.baselines == ("eager",)


def _suite(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "s.toml"
    p.write_text(text)
    return p


def test_overrides_and_shapes(tmp_path: Path) -> None:
    s = load_suite(
        _suite(
            tmp_path,
            '[budget]\nrounds = 3\n[[problem]]\nop = "rmsnorm"\ndtypes = ["fp32"]\nshapes = ["64x1024"]\n'
            "[problem.budget]\nsamples = 7\n",
        )
    )
    (p,) = s.problems
    assert (p.id, p.dtype, p.shapes, p.budget.rounds, p.budget.samples) == (
        "rmsnorm-fp32", "float32", ((64, 1024),), 3, 7,
    )  # fmt: skip


@pytest.mark.parametrize(
    "text, match",
    [
        ('[[problem]]\nop = "sofmax"\n', "unknown op 'sofmax'"),
        ('[[problem]]\nop = "softmax"\ndtypes = ["int8"]\n', "dtype .int8. is not supported"),
        ('[[problem]]\nop = "softmax"\nshapes = ["4096"]\n', "bad shape"),
        ('[[problem]]\nop = "softmax"\ndir = "x"\n', "exactly one of"),
        ('[[problem]]\nop = "softmax"\n[[problem]]\nop = "softmax"\n', "listed twice"),
        ('[[problem]]\nop = "softmax"\n[problem.budget]\nround = 2\n', "unknown budget keys"),
        ('[[problem]]\nfile = "nope.py"\n', "no such problem file"),
        ('target = "a100"\n[[problem]]\nop = "softmax"\n', "unknown target"),
        ("name = 'x'\n", "no \\[\\[problem\\]\\]"),
        ("[[problem]\n", "not valid TOML"),
    ],
)
def test_bad_suites_are_clear(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(SuiteError, match=match):
        load_suite(_suite(tmp_path, text))


def test_missing_suite_file(tmp_path: Path) -> None:
    with pytest.raises(SuiteError, match="no such suite file"):
        load_suite(tmp_path / "none.toml")
