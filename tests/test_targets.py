"""The targets: which one the visible GPU is, and the plain refusals when it is not the one asked for."""

from __future__ import annotations

import pytest

from llmcompile.specs import targets
from llmcompile.specs.targets import DEFAULT_TARGET, TARGETS, TargetError, get_target, require_gpu, target_here


@pytest.mark.parametrize(
    ("gpu", "want"),
    [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"), ("NVIDIA A100-SXM4-80GB", None), (None, None)],
)
def test_target_here_names_the_visible_gpu(monkeypatch: pytest.MonkeyPatch, gpu: str | None, want: str | None) -> None:
    monkeypatch.setattr(targets, "current_gpu", lambda: gpu)
    here = target_here()
    assert (here.name if here else None) == want


def test_require_gpu_refuses_another_card_and_no_card(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(targets, "current_gpu", lambda: "NVIDIA H200")
    assert require_gpu(get_target("h200")) == "NVIDIA H200"
    with pytest.raises(TargetError, match="this GPU is 'NVIDIA H200'; pass --target"):
        require_gpu(get_target("h100"))
    monkeypatch.setattr(targets, "current_gpu", lambda: None)
    with pytest.raises(TargetError, match="no CUDA GPU is visible"):
        require_gpu(get_target("h100"))


def test_every_default_target_is_the_one_named_in_targets() -> None:
    import inspect

    from llmcompile.agent.session import RunRequest
    from llmcompile.cli import build_parser
    from llmcompile.harness import judge

    assert DEFAULT_TARGET in TARGETS
    assert RunRequest().target == DEFAULT_TARGET  # (a literal there: llmcompile.specs imports torch)
    assert inspect.signature(judge.Judge).parameters["target"].default == DEFAULT_TARGET
    parser = build_parser()
    for command in (["check", "k.py", "--op", "softmax"], ["bench", "softmax"]):
        assert parser.parse_args(command).target == DEFAULT_TARGET
