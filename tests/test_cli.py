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


@pytest.mark.parametrize("unsafe", (False, True))
def test_no_namespaces_warns_only_when_the_flag_is_passed(
    unsafe: bool, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    """On a machine without bubblewrap the agent refuses (exit 4, saying why) unless told
    --unsafe-no-sandbox; only then does it warn that candidates run without isolation."""
    from llmcompile.harness import sandbox

    monkeypatch.setattr(sandbox, "detect", lambda gpu=False: sandbox.Layers(problems=["no bwrap binary (test)"]))
    args = ["softmax", "--target", "h100", "--compile-only", "--rounds", "1", "--samples", "1"]
    rc = main([*args, "--out", str(tmp_path / "run"), *(["--unsafe-no-sandbox"] if unsafe else [])])
    out = capsys.readouterr()
    text = out.out + out.err
    assert ("WITHOUT isolation" in text) is unsafe
    if unsafe:
        assert rc == 0
    else:
        # (4: the judge could not run, its own trouble, not a verdict on a candidate)
        assert rc == 4 and "no bwrap binary (test)" in text and "--unsafe-no-sandbox" in text


@pytest.mark.parametrize(
    ("op", "said"),
    [("nosuchop", "unknown op 'nosuchop'"), ("/no/such/problem.py", "no such problem file: /no/such/problem.py")],
)
def test_a_bad_op_is_said_before_anything_starts(op: str, said: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The run starts its judge before it loads a problem file: a name that is no op, or a file
    that is not there, is still the error the user sees (not the GPU check, not a judge start)."""
    assert main([op, "--target", "h100"]) == 2
    assert said in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--rounds", "0"], "'0' is not an integer >= 1"),
        (["--samples", "two"], "'two' is not an integer >= 1"),
        (["--shapes", "0x1024"], "M and N must be at least 1"),
    ],
)
def test_a_bad_budget_or_shape_is_refused(flags: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    """(0 rounds ended "no candidate passed"; a shape of 0 rows compiled.)"""
    try:
        rc = main(["softmax", "--target", "h100", "--compile-only", *flags])
    except SystemExit as e:  # (argparse's own refusal)
        rc = e.code
    assert rc == 2 and said in capsys.readouterr().err
