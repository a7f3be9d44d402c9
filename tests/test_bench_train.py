"""The training-step bench (`llmcompile bench --train`): a step's gradients, what a step must
move, the command's errors (CPU); a small grid timed on the GPU."""

from __future__ import annotations

import pytest
import torch

from llmcompile.bench import train
from llmcompile.cli import main
from llmcompile.specs import get_op


@pytest.mark.parametrize("op", sorted(train.TRAIN_OPS))
def test_a_step_returns_torchs_gradients_and_accumulates_nothing(op: str) -> None:
    spec = get_op(op)
    ins = spec.make_inputs(4, 32, "float32", torch.Generator().manual_seed(0), "random", "cpu")
    fn = train.IMPLS["eager"](op, 32, dict(spec.scalars))
    run = train.step(op, fn, ins, seed=1)
    first = run()
    again = run()
    leaves = [t.clone().requires_grad_() for t in ins if t.is_floating_point()]
    args = [leaves.pop(0) if t.is_floating_point() else t for t in ins]
    out = fn(*args)
    floats = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    if op == "cross_entropy":
        out.sum().backward()
    else:
        dy = torch.randn(ins[0].shape, generator=torch.Generator().manual_seed(1), dtype=ins[0].dtype)
        (out * dy).sum().backward()
    assert len(first) == len(floats) == (1 if op in ("softmax", "log_softmax", "cross_entropy") else 1 + len(ins[1:]))
    for g, g2, leaf in zip(first, again, floats):
        torch.testing.assert_close(g, leaf.grad)
        torch.testing.assert_close(g2, g)  # (nothing accumulated between steps)


def test_a_step_moves_its_forward_and_backward_bytes() -> None:
    m, n = 32768, 1024
    assert train.work("rmsnorm", m, n, "bfloat16") == (
        get_op("rmsnorm").bytes_moved(m, n, "bfloat16") + get_op("rmsnorm_bwd").bytes_moved(m, n, "bfloat16")
    )


def test_every_implementation_says_why_it_cannot_take_an_op() -> None:
    with pytest.raises(train.Unavailable):
        train.IMPLS["eager"]("attention", 64, {})


def test_bench_train_names_the_unknown_op(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--train", "rmsnorm_bwd"]) == 2
    assert "unknown training step 'rmsnorm_bwd'" in capsys.readouterr().err


@pytest.mark.gpu
def test_bench_train_times_ours_and_torch_on_a_small_grid(tmp_path) -> None:  # noqa: ANN001
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (run .ci/gpu on the H100)")
    result = train.run(["rmsnorm", "cross_entropy"], ["bfloat16"], [(4096, 1024)], ["llmcompile", "eager"])
    assert {(r.op, r.impl) for r in result.rows} == {
        (o, i) for o in ("rmsnorm", "cross_entropy") for i in ("llmcompile", "eager")
    }
    # (a rate a wrong byte count or clock would give, a factor off, fails. The copy is measured while
    # the suite's other workers share the GPU: at 14 of them it read 2.06 TB/s on an H200 and this
    # step's cross-entropy 2.21, so the bound is not the 1.05 a GPU of its own would allow.)
    assert all(r.ms and r.ms > 0 and r.tbs and r.tbs < 1.5 * result.sol_tbs for r in result.rows), result.rows


def test_the_first_point_is_measured_once_more_and_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process's first point carries one-time costs: it is measured once, dropped, then measured
    for the table; every other point once."""
    calls: list[tuple] = []

    def fake_step(spec, m, n, dtype, sol, impls, graph, rounds):  # noqa: ANN001, ANN202
        calls.append((spec.name, m, n, dtype, rounds))
        return [train.BenchRow(spec.name, dtype, m, n, "llmcompile", 0.1, 1.0, 50.0, "", "TB/s", [0.1])]

    monkeypatch.setattr(train, "bench_step", fake_step)
    monkeypatch.setattr(train.timing, "copy_bandwidths", lambda extra=None: {"torch": 2.0})
    monkeypatch.setattr(train.torch.cuda, "get_device_name", lambda i=0: "fake")
    result = train.run(
        ["softmax"], ["float32"], [(64, 256), (64, 512)], ["llmcompile"], rounds=5, progress=lambda s: None
    )
    assert calls == [
        ("softmax", 64, 256, "float32", 1),
        ("softmax", 64, 256, "float32", 5),
        ("softmax", 64, 512, "float32", 5),
    ]
    assert [(r.m, r.n) for r in result.rows] == [(64, 256), (64, 512)]
