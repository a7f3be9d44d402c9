from __future__ import annotations

import pytest

from llmcompile.cli import main
from tests.conftest import HAS_GPU


def test_help_lists_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for cmd in ("list", "doctor", "bench"):
        assert cmd in out


def test_list_shows_ops_and_targets(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ("softmax", "log_softmax", "rmsnorm", "layernorm", "cross_entropy", "h100", "h200", "sm_90a"):
        assert name in out


def test_doctor_reports_versions_and_advice(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    main(["doctor"])
    out = capsys.readouterr().out
    assert "cute-dsl" in out and "torch" in out and "offline provider" in out
    if not HAS_GPU:
        assert "no CUDA GPU" in out


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU message")
def test_bench_without_gpu_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "softmax"]) == 2
    assert "no CUDA GPU is visible" in capsys.readouterr().err


def test_unknown_target_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "softmax", "--target", "a100"]) == 2
    assert "unknown target 'a100'" in capsys.readouterr().err


def test_list_shows_custom_problems(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    from pathlib import Path

    problems = Path(__file__).resolve().parents[1] / "evals/problems"
    assert main(["list", str(problems)]) == 0
    out = capsys.readouterr().out
    assert f"custom ops (KernelBench files) in {problems}" in out
    for name in ("add_rmsnorm", "swiglu", "l2norm_rows", "mean_dim1", "mse_rows"):
        assert f"  {name} " in out
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\n")
    assert main(["list", str(bad)]) == 2
    assert "Model, get_inputs and get_init_inputs" in capsys.readouterr().err
