"""Differentiable kernels: `kernels.softmax`, `log_softmax` and `cross_entropy` take the
autograd path where x requires grad; their gradients against torch's autograd (GPU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from llmcompile.callpath import KernelFunction
from llmcompile.ops import get_op


def test_an_input_that_requires_grad_takes_the_differentiable_call() -> None:
    seen: list[str] = []
    fn = KernelFunction(get_op("softmax"), lambda dtype, n: seen.append("lean") or (lambda *a: None))
    fn.grad_fn = lambda x: seen.append("grad") or x
    x = torch.randn(2, 8, requires_grad=True)
    assert fn(x) is x and seen == ["grad"]
    with torch.no_grad():
        with pytest.raises(Exception, match="CUDA device"):  # no grad wanted: the lean call, which wants a GPU
            fn(x)
    assert seen == ["grad"]


def test_the_builtin_forward_ops_are_differentiable_and_their_backward_ops_exist() -> None:
    from llmcompile import kernels

    for op in ("softmax", "log_softmax", "cross_entropy"):
        assert kernels.BY_NAME[op].grad_fn is not None
    for op in ("softmax_bwd", "log_softmax_bwd", "cross_entropy_bwd", "cross_entropy_fwd"):
        assert kernels.BY_NAME[op].spec.name == op
    x = torch.randn(2, 8, requires_grad=True)
    with pytest.raises(TypeError, match="beta"):  # refused before any kernel, as the lean call refuses it
        kernels.softmax(x, beta=1.0)


TOL = {torch.float32: (1e-5, 1e-4), torch.bfloat16: (1e-2, 2e-2)}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_gradients_match_torch(dtype: torch.dtype, log: bool) -> None:
    from llmcompile import kernels

    ours_fn = kernels.log_softmax if log else kernels.softmax
    torch_fn = torch.log_softmax if log else torch.softmax
    gen = torch.Generator(device="cuda").manual_seed(0)
    for shape in [(3, 5, 1000), (64, 4096), (2, 40000)]:
        x = torch.randn(shape, device="cuda", generator=gen).to(dtype)
        dy = torch.randn(shape, device="cuda", generator=gen).to(dtype)
        a = x.clone().requires_grad_()
        b = x.clone().requires_grad_()
        ours = ours_fn(a)
        want = torch_fn(b, -1)
        ours.backward(dy)
        want.backward(dy)
        atol, rtol = TOL[dtype]
        torch.testing.assert_close(ours, want, atol=atol, rtol=rtol)
        torch.testing.assert_close(a.grad, b.grad, atol=atol, rtol=rtol)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cross_entropy_gradients_match_torch(dtype: torch.dtype) -> None:
    from llmcompile import kernels

    gen = torch.Generator(device="cuda").manual_seed(1)
    for m, n in [(37, 1000), (256, 32000), (8, 131072)]:
        x = torch.randn(m, n, device="cuda", generator=gen).to(dtype)
        target = torch.randint(0, n, (m,), device="cuda", generator=gen)
        target[::5] = -100
        dloss = torch.randn(m, device="cuda", generator=gen)
        a = x.clone().requires_grad_()
        b = x.clone().requires_grad_()
        ours = kernels.cross_entropy(a, target)
        want = F.cross_entropy(b.float(), target, reduction="none")
        ours.backward(dloss)
        want.backward(dloss)
        torch.testing.assert_close(ours, want, atol=1e-4, rtol=1e-4)
        atol, rtol = TOL[dtype]
        torch.testing.assert_close(a.grad, b.grad, atol=atol, rtol=rtol)
        assert not a.grad[::5].any()  # ignored rows: no gradient
        # a mean's upstream gradient is one value broadcast (stride 0): taken on the checked path
        a.grad = None
        kernels.cross_entropy(a, target).mean().backward()
        b.grad = None
        F.cross_entropy(b.float(), target, reduction="none").mean().backward()
        torch.testing.assert_close(a.grad, b.grad.to(dtype), atol=atol, rtol=rtol)


@pytest.mark.gpu
def test_backward_is_deterministic_and_compiles_fullgraph() -> None:
    from llmcompile import kernels

    x = torch.randn(64, 2048, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    grads = []
    for _ in range(2):
        x.grad = None
        kernels.softmax(x).backward(dy)
        grads.append(x.grad.clone())
    assert torch.equal(grads[0], grads[1])
    step = torch.compile(lambda t: (kernels.softmax(t) * 2).sum(), fullgraph=True)
    x.grad = None
    step(x).backward()
    want = x.detach().clone().requires_grad_()
    (torch.softmax(want, -1) * 2).sum().backward()
    torch.testing.assert_close(x.grad, want.grad, atol=1e-2, rtol=2e-2)


@pytest.mark.gpu
def test_a_training_step_follows_torchs_loss_curve() -> None:
    """A 2-layer MLP trained 100 steps with our cross-entropy gives torch's loss curve
    (RMSNorm is torch's in both: its backward kernel is not built yet)."""
    from llmcompile import kernels

    def curve(loss_fn) -> list[float]:  # noqa: ANN001
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.RMSNorm(512), torch.nn.Linear(512, 1000)
        ).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        gen = torch.Generator(device="cuda").manual_seed(0)
        # four batches seen 25 times each: a set the model can fit, so the loss must fall
        data = torch.randn(4, 64, 256, device="cuda", generator=gen)
        labels = torch.randint(0, 1000, (4, 64), device="cuda", generator=gen)
        losses = []
        for step in range(100):
            xb, yb = data[step % 4], labels[step % 4]
            loss = loss_fn(model(xb), yb).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    ours = curve(kernels.cross_entropy)
    want = curve(lambda logits, y: F.cross_entropy(logits, y, reduction="none"))
    assert ours[-1] < ours[0] * 0.7, ours[::10]  # it learns
    assert max(abs(a - b) for a, b in zip(ours, want)) < 1e-3 * max(want), (ours[::10], want[::10])
