"""evals/scripts/train_llama.py: the training run of issue 47 (torch's ops against ours, same
start, same tokens)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from evals.scripts import train_llama as T


def test_the_tokens_are_a_fixed_chain() -> None:
    cfg = T.Config(vocab=64, seq=16, batch=2, steps=3, successors=4)
    a, b = T.markov_tokens(cfg, "cpu"), T.markov_tokens(cfg, "cpu")
    assert a.shape == (3, 2, 17) and torch.equal(a, b)
    # every token is followed by one of its 4 successors: far fewer pairs than 64 x 64
    pairs = {(int(x), int(y)) for row in a.view(-1, 17) for x, y in zip(row[:-1], row[1:])}
    firsts = {x for x, _ in pairs}
    assert all(sum(1 for p in pairs if p[0] == f) <= 4 for f in firsts)


def test_a_tiny_run_with_torchs_ops_learns_and_writes_its_results(tmp_path: Path) -> None:
    T.main(["--tiny", "--steps", "40", "--ops", "torch", "--device", "cpu", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "train-llama.json").read_text())
    loss = data["runs"]["torch"]["loss"]
    assert len(loss) == 40 and sum(loss[-5:]) / 5 < sum(loss[:5]) / 5 - 0.3
    assert data["runs"]["torch"]["tokens_per_s"] > 0
    assert (tmp_path / "train-llama.png").stat().st_size > 0 and "| torch |" in (
        tmp_path / "train-llama.md"
    ).read_text()


def test_two_ops_train_in_lockstep_from_one_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs interleaved step by step: the same ops give the same curve, each its own tokens/s."""

    class Same(T.TorchOps):
        name = "llmcompile"

    monkeypatch.setattr(T, "OurOps", Same)
    T.main(["--tiny", "--steps", "6", "--ops", "torch", "llmcompile", "--device", "cpu", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "train-llama.json").read_text())
    assert data["runs"]["torch"]["loss"] == data["runs"]["llmcompile"]["loss"] and data["max_abs_loss_diff"] == 0
    assert all(r["tokens_per_s"] > 0 for r in data["runs"].values())


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without a GPU")
def test_our_ops_refuse_without_a_gpu_before_training(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        T.main(["--tiny", "--steps", "2", "--out", str(tmp_path)])
    assert not (tmp_path / "train-llama.json").exists()


@pytest.mark.gpu
def test_our_ops_follow_torchs_on_the_gpu(tmp_path: Path) -> None:
    """A short run at the real model's width: the two loss curves within bf16 noise."""
    T.main(["--steps", "30", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "train-llama.json").read_text())
    assert data["max_abs_loss_diff"] < 0.1, data["max_abs_loss_diff"]


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["model", "dense"])
def test_our_attention_forward_feeds_torchs_backward_as_well_as_sdpa_does(layout: str) -> None:
    """The run's attention (our forward, torch's backward kernel on our o and lse, through
    `kernels.attention_causal_d64`'s autograd): gradients as near float64's as SDPA's own, for q,
    k, v as the model has them (strided views of one (b, s, 3, h, d) projection) and dense."""
    torch.manual_seed(0)
    b, h, s, d = 2, 4, 384, 64
    qkv = torch.randn(b, s, 3, h, d, device="cuda", dtype=torch.bfloat16).permute(2, 0, 3, 1, 4)
    qkv = qkv if layout == "model" else qkv.contiguous()
    dy = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)

    def grads(fn, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:  # noqa: ANN001
        x = [t.to(dtype).detach().requires_grad_() for t in qkv]
        return torch.autograd.grad(fn(*x), x, dy.to(dtype))

    def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    ref, theirs, ours = (
        grads(sdpa, torch.float64),
        grads(sdpa, torch.bfloat16),
        grads(T.OurOps().attention, torch.bfloat16),
    )
    for name, o, t, r in zip("qkv", ours, theirs, ref):
        err_o, err_t = ((g.double() - r).abs().max().item() for g in (o, t))
        assert err_o <= 2 * err_t + 1e-2, (name, err_o, err_t)


def test_two_runs_are_compared_in_bf16_where_torchs_loss_is_bf16(tmp_path: Path) -> None:
    """torch's loss of bf16 logits is a bf16 value and ours fp32: the report says how many steps
    agree once ours is rounded to bf16, so the rounding of torch's value is not read as a gap."""
    cfg = T.Config(steps=3)
    runs = {
        "torch": {"loss": [8.0, 4.0, 2.0], "tokens_per_s": 1.0},
        "llmcompile": {"loss": [8.01, 4.0, 2.02], "tokens_per_s": 1.0},
    }
    T.write(tmp_path, cfg, runs, "test")
    data = json.loads((tmp_path / "train-llama.json").read_text())
    assert data["bf16_steps_apart"] == 1  # 8.01 rounds to 8.0; 2.02 to 2.015625, one bf16 step from 2.0
    assert abs(data["max_abs_loss_diff_bf16"] - 0.015625) < 1e-9
    assert "equals torch's at 2 of 3 steps" in (tmp_path / "train-llama.md").read_text()
