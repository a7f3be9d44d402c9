"""Differentiable kernels: `kernels.softmax`, `log_softmax`, `cross_entropy`, `rmsnorm` and
`layernorm` take the autograd path where an input requires grad; their gradients against
torch's autograd (GPU)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
import torch.nn.functional as F

from llmcompile.runtime import autograd, autograd_native
from llmcompile.runtime.callpath import KernelFunction
from llmcompile.specs import BUILTIN, get_op


def test_the_norm_references_are_torchs_gradients() -> None:
    """The float64 references the judge checks the norm kernels against are torch's autograd."""
    from llmcompile.specs import references as ops

    gen = torch.Generator().manual_seed(0)
    x, w, b, dy = (torch.randn(s, generator=gen, dtype=torch.float64) for s in ((7, 33), 33, 33, (7, 33)))
    w = w.abs() + 0.5
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    F.rms_norm(leaves[0], (33,), leaves[1], 1e-6).backward(dy)
    out, rstd = ops.ref_rmsnorm_fwd(x, w, 1e-6)
    torch.testing.assert_close(out, F.rms_norm(x, (33,), w, 1e-6))
    for got, want in zip(ops.ref_rmsnorm_bwd(dy, x, w, rstd), leaves):
        torch.testing.assert_close(got, want.grad)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    F.layer_norm(leaves[0], (33,), leaves[1], leaves[2], 1e-5).backward(dy)
    out, mean, rstd = ops.ref_layernorm_fwd(x, w, b, 1e-5)
    torch.testing.assert_close(out, F.layer_norm(x, (33,), w, b, 1e-5))
    for got, want in zip(ops.ref_layernorm_bwd(dy, x, w, mean, rstd), leaves):
        torch.testing.assert_close(got, want.grad)


def test_the_lean_apply_is_the_functions_apply() -> None:
    """`_lean_apply` skips torch's Python wrapper of `Function.apply` (half a small op's host time
    through autograd) and gives the same graph and gradients; under functorch and while dynamo
    traces, the wrapper runs as before."""

    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx: object, x: torch.Tensor, k: float) -> torch.Tensor:
            ctx.k = k
            return x * k

        @staticmethod
        def backward(ctx: object, g: torch.Tensor) -> tuple[torch.Tensor, None]:
            return g * ctx.k, None

    apply = autograd._lean_apply(Double)
    x = torch.randn(4, requires_grad=True)
    y = apply(x, 3.0)
    assert type(y.grad_fn).__name__ == "DoubleBackward"
    (g,) = torch.autograd.grad(y.sum(), x)
    assert torch.equal(g, torch.full_like(x, 3.0))
    with pytest.raises(RuntimeError, match="setup_context"):  # torch's own word for such a Function
        torch.func.grad(lambda t: apply(t, 3.0).sum())(x.detach())
    traced = torch.compile(lambda t: apply(t, 3.0).sum(), backend="eager", fullgraph=True)
    (g2,) = torch.autograd.grad(traced(x), x)
    assert torch.equal(g2, g)


def test_a_weight_that_requires_grad_takes_the_differentiable_call() -> None:
    seen: list[str] = []
    fn = KernelFunction(get_op("rmsnorm"), lambda dtype, n: seen.append("lean") or (lambda *a: None))
    fn.grad_fn = lambda x, w: seen.append("grad") or x
    x, w = torch.randn(2, 8), torch.ones(8, requires_grad=True)
    assert fn(x, w) is x and seen == ["grad"]


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

    for op in ("softmax", "log_softmax", "cross_entropy", "rmsnorm", "layernorm"):
        assert kernels.BY_NAME[op].grad_fn is not None
    backward = ("softmax_bwd", "log_softmax_bwd", "cross_entropy_bwd", "rmsnorm_bwd", "layernorm_bwd")
    backward += ("softmax_bwd_scalar", "log_softmax_bwd_scalar")
    for op in (*backward, "cross_entropy_fwd", "rmsnorm_fwd", "layernorm_fwd"):
        assert kernels.BY_NAME[op].spec.name == op
    x = torch.randn(2, 8, requires_grad=True)
    with pytest.raises(TypeError, match="beta"):  # refused before any kernel, as the lean call refuses it
        kernels.softmax(x, beta=1.0)


@pytest.mark.parametrize("log", [False, True])
def test_a_sums_gradient_reaches_the_python_function_as_its_one_value(
    monkeypatch: pytest.MonkeyPatch, log: bool
) -> None:
    """The Python Function (what functorch and torch.compile see, and the C++ nodes' fallback):
    .sum()'s expanded gradient goes to the one-value backward as a (1,) view, a dense gradient
    to the rows backward, and each gives torch's gradient (stand-in kernels on the CPU)."""
    from llmcompile.specs import references as ops

    monkeypatch.setattr(autograd, "NATIVE_NODES", False)
    calls: list[str] = []
    name = "log_softmax" if log else "softmax"
    forward = torch.log_softmax if log else torch.softmax
    rows = ops.ref_log_softmax_bwd if log else ops.ref_softmax_bwd
    one = BUILTIN[f"{name}_bwd_scalar"].reference

    def rec(op: str, fn: object) -> object:
        def call(*args: torch.Tensor) -> torch.Tensor:
            calls.append(op)
            if op.endswith("_scalar"):
                assert args[1].shape == (1,)
            return fn(*args)

        return call

    monkeypatch.setattr(autograd.kernels, name, rec(name, lambda x: forward(x, -1)))
    monkeypatch.setattr(autograd.kernels, f"{name}_bwd", rec("rows", lambda dy, y: rows(dy, y)[0]))
    monkeypatch.setattr(autograd.kernels, f"{name}_bwd_scalar", rec("one", lambda y, c: one(y, c)[0]))
    x = torch.randn(3, 4, 33, dtype=torch.float64)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    ours, want = getattr(autograd, name)(a), forward(b, -1)
    torch.testing.assert_close(torch.autograd.grad(ours.sum() * 3.0, a, retain_graph=True)[0],
                               torch.autograd.grad(want.sum() * 3.0, b, retain_graph=True)[0])  # fmt: skip
    dy = torch.randn_like(x)
    torch.testing.assert_close(torch.autograd.grad(ours, a, dy)[0], torch.autograd.grad(want, b, dy)[0])
    assert calls == [name, "one", "rows"]


@pytest.mark.parametrize("bias", [False, True], ids=["rmsnorm", "layernorm"])
def test_a_sums_gradient_reaches_the_norm_functions_as_its_one_value(
    monkeypatch: pytest.MonkeyPatch, bias: bool
) -> None:
    """The norms' Python Functions: .sum()'s expanded gradient goes to the one-value backward as a
    (1,) view, and dx, dw (and db) are torch's (stand-in kernels on the CPU)."""
    from llmcompile.specs import references as ops

    monkeypatch.setattr(autograd, "NATIVE_NODES", False)
    name = "layernorm" if bias else "rmsnorm"
    calls: list[str] = []

    def rec(op: str, fn: object) -> object:
        def call(*args: torch.Tensor, **kw: float) -> object:
            calls.append(op)
            return fn(*args, **kw)

        return call

    def one(x: torch.Tensor, c: torch.Tensor, *rest: torch.Tensor) -> list[torch.Tensor]:
        assert c.shape == (1,) and c.dtype == x.dtype
        return BUILTIN[f"{name}_bwd_scalar"].reference(x, c, *rest)

    fwd = getattr(ops, f"ref_{name}_fwd")
    monkeypatch.setattr(
        autograd.kernels, f"{name}_fwd", rec("fwd", lambda *a, eps=1e-6 if not bias else 1e-5: fwd(*a, eps))
    )
    monkeypatch.setattr(autograd.kernels, f"{name}_bwd", rec("rows", getattr(ops, f"ref_{name}_bwd")))
    monkeypatch.setattr(autograd.kernels, f"{name}_bwd_scalar", rec("one", one))
    x = torch.randn(6, 40, dtype=torch.float64)
    params = (torch.rand(40, dtype=torch.float64) + 0.5, torch.randn(40, dtype=torch.float64))[: 2 if bias else 1]
    mine = [t.clone().requires_grad_() for t in (x, *params)]
    ref = [t.clone().requires_grad_() for t in (x, *params)]
    out = getattr(autograd, name)(*mine, eps=1e-5)
    want = F.layer_norm(ref[0], (40,), *ref[1:], 1e-5) if bias else F.rms_norm(ref[0], (40,), ref[1], 1e-5)
    for g, r in zip(torch.autograd.grad(out.sum() * 3.0, mine), torch.autograd.grad(want.sum() * 3.0, ref)):
        torch.testing.assert_close(g, r)
    assert calls == ["fwd", "one"]


TOL = {torch.float32: (1e-5, 1e-4), torch.bfloat16: (1e-2, 2e-2)}


def _scale_(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """compiled.scale_'s stand-in (CPU): x *= a[0] * b[0] in place."""
    assert a.shape == b.shape == (1,)
    return x.mul_(a * b)


@pytest.fixture(params=["python", "cpp"])
def fused_loss(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """cross_entropy_loss on one of its two paths, with a setter for its fused kernel's stand-in
    (and `scale_`'s, its backward; and `total`, the loss's call where no gradient is wanted): the
    Python Function (LLMCOMPILE_NATIVE_AUTOGRAD=0, the kernel function module's attributes) or the
    C++ node (the extension's registration; the real kernels registered again after)."""
    monkeypatch.setattr(autograd, "NATIVE_NODES", request.param == "cpp")

    def python(fn: object, scale: object = _scale_, total: object = None) -> None:
        monkeypatch.setattr(autograd.kernels, "cross_entropy_fused_total", fn)
        monkeypatch.setattr(autograd.kernels, "scale_", scale)
        if total is not None:
            monkeypatch.setattr(autograd.kernels, "cross_entropy_total", total)

    if request.param == "python":
        yield python
        return
    m = autograd_native.module()
    assert m is not None, f"the C++ autograd nodes did not build on this machine: {autograd_native.reason()}"

    def cpp(fn: object, scale: object = _scale_, total: object = None) -> None:
        python(fn, scale, total)  # (an ignore_index not the kernel's own goes to Python on this path too)
        m.register_op(m.CE_LOSS, fn, scale)
        if total is not None:
            m.register_op(m.CE_TOTAL, total, None)

    try:
        yield cpp
    finally:
        # the stand-ins off the kernel module first: registered again under them, they would stay
        # the C++ nodes' kernels for the rest of the process (a GPU test after took them)
        monkeypatch.undo()
        autograd_native.register_kernels(m)


def test_the_fused_loss_backward_scales_its_kept_gradient_in_place(fused_loss: Callable[..., None]) -> None:
    """cross_entropy_loss's backward multiplies the gradient its forward wrote by any upstream
    gradient without asking its value (no host sync); a second backward of the graph rescales a
    copy, one after an upstream 0 is refused, not answered with zeros, and one through a freed
    graph is refused (stand-in kernel, CPU; the C++ node and the Python Function alike)."""

    def fused(x: torch.Tensor, t: torch.Tensor, ignore_index: int = -100) -> tuple[torch.Tensor, ...]:
        return BUILTIN["cross_entropy_fused_total"].reference(x, t, ignore_index)

    fused_loss(fused)
    x = torch.randn(2, 5, 7, dtype=torch.float64)
    t = torch.randint(0, 7, (2, 5))
    t[0, 0] = -100
    want = torch.func.grad(lambda v: F.cross_entropy(v.reshape(-1, 7), t.reshape(-1)))(x)
    ours = x.clone().requires_grad_()
    loss = autograd.cross_entropy_loss(ours, t)
    native = loss.grad_fn.name() == "llmcompile::CrossEntropyLossNode"
    assert native == autograd.NATIVE_NODES, loss.grad_fn.name()
    torch.testing.assert_close(loss, F.cross_entropy(x.reshape(-1, 7), t.reshape(-1)))
    (loss * 3.0).backward(retain_graph=True)
    torch.testing.assert_close(ours.grad, 3.0 * want)
    ours.grad = None
    (loss * -2.0).backward(retain_graph=True)  # dx now holds 3x: rescaled, on a copy
    torch.testing.assert_close(ours.grad, -2.0 * want)
    ours.grad = None
    loss.backward()
    torch.testing.assert_close(ours.grad, want)
    loss = autograd.cross_entropy_loss(x.clone().requires_grad_(), t)
    (loss * 0.0).backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="upstream gradient of 0"):
        loss.backward()
    loss = autograd.cross_entropy_loss(x.clone().requires_grad_(), t, reduction="sum")
    loss.backward()
    with pytest.raises(RuntimeError, match="second time"):
        loss.backward()
    ours, t = x.clone().requires_grad_(), t.clamp(min=0)
    loss = autograd.cross_entropy_loss(ours, t, ignore_index=3)
    assert "Node" not in loss.grad_fn.name()
    loss.backward()
    want = torch.func.grad(lambda v: F.cross_entropy(v.reshape(-1, 7), t.reshape(-1), ignore_index=3))(x)
    torch.testing.assert_close(ours.grad, want)


def test_the_fused_loss_is_one_call_forward_and_one_backward(
    fused_loss: Callable[..., None],
) -> None:
    """Each small torch op of cross_entropy_loss is a launch, 10-30 us of host on an H200 machine
    (evals/results/training-run): the forward is the kernel's one call, which also sums and counts
    (the five ops that did that after it were 1.7x torch's host time, issue 47); the backward is
    `scale_`'s one pass over dx, times the upstream gradient and 1/kept (torch ops counted by a
    dispatch mode: the stand-ins' own are made outside it)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            if func.__name__.split(".")[0] not in ("view", "detach", "_unsafe_view"):
                self.seen.append(func.__name__.split(".")[0])
            return func(*args, **(kwargs or {}))

    x, t = torch.randn(10, 7, dtype=torch.float64), torch.randint(0, 7, (10,))
    one = torch.ones(1, dtype=torch.float64)
    made = (x[:, 0], torch.ones_like(x), one * 10, one, one / 10)  # (made here: the kernel's ops are not counted)
    scaled: list[tuple[torch.Tensor, ...]] = []
    fused_loss(lambda *_, **__: made, lambda dx, a, b: scaled.append((dx, a, b)) or dx)
    ours = x.clone().requires_grad_()
    autograd._one(x.device)  # (a sum's scale, made by a device's first call only; this test alone may be it)
    with Ops() as forward:
        forward.seen = []
        loss = autograd.cross_entropy_loss(ours, t)
    assert forward.seen == [] and loss.shape == ()
    with Ops() as backward:
        backward.seen = []
        loss.backward()
    assert backward.seen == ["ones_like"]  # (the engine's upstream 1)
    ((dx, a, b),) = scaled
    assert dx.data_ptr() == made[1].data_ptr() and a.shape == (1,) and a.item() == 1.0 and b is made[4]


def test_the_loss_without_a_gradient_is_one_call(fused_loss: Callable[..., None]) -> None:
    """cross_entropy_loss where no gradient is wanted (no_grad, or logits that need none): the
    kernel's one call (cross_entropy_total, a float64 stand-in here; the fused kernel never) gives
    the sum and the mean, no torch op after it, through the C++ node and the Python path alike; an
    ignore_index not the kernel's own reaches it by keyword; a batch of ignored rows has a mean of
    0, as the gradient's path gives (kept is at least 1)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: list[dict] = []

    def total(x: torch.Tensor, t: torch.Tensor, **kw: int) -> list[torch.Tensor]:
        seen.append(kw)
        return BUILTIN["cross_entropy_total"].reference(x, t, kw.get("ignore_index", -100))

    def fused(*_: object) -> None:
        raise AssertionError("the fused kernel (it writes dx) took a loss that wants no gradient")

    fused_loss(fused, total=total)
    x = torch.randn(2, 5, 7, dtype=torch.float64)
    t = torch.randint(0, 7, (2, 5))
    t[0, 0] = -100
    for reduction in ("mean", "sum"):
        want = F.cross_entropy(x.reshape(-1, 7), t.reshape(-1), reduction=reduction)
        torch.testing.assert_close(autograd.cross_entropy_loss(x, t, reduction=reduction), want)
        with torch.no_grad():
            got = autograd.cross_entropy_loss(x.clone().requires_grad_(), t, reduction=reduction)
        assert got.shape == () and not got.requires_grad
        torch.testing.assert_close(got, want)
    got = autograd.cross_entropy_loss(x, t.clamp(min=0), ignore_index=3)
    torch.testing.assert_close(got, F.cross_entropy(x.reshape(-1, 7), t.clamp(min=0).reshape(-1), ignore_index=3))
    assert seen == [{}] * 4 + [{"ignore_index": 3}]
    assert autograd.cross_entropy_loss(x, torch.full_like(t, -100)).item() == 0.0

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            if func.__name__.split(".")[0] not in ("view", "_unsafe_view"):
                self.seen.append(func.__name__.split(".")[0])
            return func(*args, **(kwargs or {}))

    made = total(x.reshape(-1, 7), t.reshape(-1))  # (made here: the kernel's ops are not counted)
    fused_loss(fused, total=lambda *_, **__: made)
    with Ops() as ops:
        ops.seen = []
        autograd.cross_entropy_loss(x, t)
    assert ops.seen == []


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
        # .sum()'s gradient, expanded from one value (here 3): read as that value
        # (softmax_bwd_scalar), not made dense; torch reads it in place too
        a.grad = b.grad = None
        (ours_fn(a).sum() * 3.0).backward()
        (torch_fn(b, -1).sum() * 3.0).backward()
        torch.testing.assert_close(a.grad, b.grad, atol=atol * 3, rtol=rtol)


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
        # a mean's upstream gradient is one value broadcast (stride 0): the fused kernel's scale
        a.grad = None
        kernels.cross_entropy(a, target).mean().backward()
        b.grad = None
        F.cross_entropy(b.float(), target, reduction="none").mean().backward()
        torch.testing.assert_close(a.grad, b.grad.to(dtype), atol=atol, rtol=rtol)
    # logits of a (batch, sequence) shape, the loss summed: every stride of the upstream gradient 0
    x3 = torch.randn(2, 3, 1000, device="cuda", generator=gen).to(dtype)
    t3 = torch.randint(0, 1000, (2, 3), device="cuda", generator=gen)
    t3[0, 1] = -100
    a, b = x3.clone().requires_grad_(), x3.clone().requires_grad_()
    (kernels.cross_entropy(a, t3).sum() * 0.5).backward()
    (F.cross_entropy(b.float().view(-1, 1000), t3.view(-1), reduction="none").sum() * 0.5).backward()
    assert a.grad.shape == x3.shape and not a.grad[0, 1].any()
    torch.testing.assert_close(a.grad, b.grad.to(dtype), atol=atol, rtol=rtol)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(3, 5, 1000), (4096, 1024), (8, 65536), (2, 262144)])
def test_norm_gradients_match_torch(dtype: torch.dtype, bias: bool, shape: tuple[int, ...]) -> None:
    """dx, dw (and db) of our RMSNorm / LayerNorm against torch's autograd, the float64 one
    for the weight's sums over rows; and bit-identical on a second backward."""
    from llmcompile import kernels

    gen = torch.Generator(device="cuda").manual_seed(1)
    n = shape[-1]
    x = torch.randn(shape, device="cuda", generator=gen).to(dtype)
    w = (torch.rand(n, device="cuda", generator=gen) + 0.5).to(dtype)
    b = torch.randn(n, device="cuda", generator=gen).to(dtype)
    dy = torch.randn(shape, device="cuda", generator=gen).to(dtype)
    params = (w, b) if bias else (w,)
    ours = [t.clone().requires_grad_() for t in (x, *params)]
    want = [t.double().requires_grad_() for t in (x, *params)]
    if bias:
        out = kernels.layernorm(*ours)
        ref = F.layer_norm(want[0], (n,), want[1], want[2], 1e-5)
    else:
        out = kernels.rmsnorm(*ours)
        ref = F.rms_norm(want[0], (n,), want[1], 1e-6)
    out.backward(dy)
    ref.backward(dy.double())
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out, ref.to(dtype), atol=atol, rtol=rtol)
    for a, e in zip(ours, want):
        # a weight's gradient sums M rows: its error grows with sqrt(M) terms of the row's size
        scale = max(1.0, e.grad.abs().max().item()) if a.dim() == 1 else 1.0
        torch.testing.assert_close(a.grad, e.grad.to(dtype), atol=atol * scale, rtol=rtol)
    first = [a.grad.clone() for a in ours]
    for a in ours:
        a.grad = None
    (kernels.layernorm(*ours) if bias else kernels.rmsnorm(*ours)).backward(dy)
    assert all(torch.equal(a.grad, f) for a, f in zip(ours, first))
    # .sum()'s gradient, expanded from one value (here 3), read as that value (*_bwd_scalar)
    for t in (*ours, *want):
        t.grad = None
    ((kernels.layernorm(*ours) if bias else kernels.rmsnorm(*ours)).sum() * 3.0).backward()
    (
        (F.layer_norm(want[0], (n,), *want[1:], 1e-5) if bias else F.rms_norm(want[0], (n,), want[1], 1e-6)).sum() * 3.0
    ).backward()
    for a, e in zip(ours, want):
        scale = max(1.0, e.grad.abs().max().item()) if a.dim() == 1 else 1.0
        torch.testing.assert_close(a.grad, e.grad.to(dtype), atol=atol * scale * 3, rtol=rtol)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["rmsnorm", "layernorm"])
@pytest.mark.parametrize("shape", [(3, 5, 1000), (512, 4096)])
def test_fp32_weights_beside_bf16_rows(op: str, shape: tuple[int, ...]) -> None:
    """Mixed precision as training keeps it: bf16 activations, fp32 weight (and bias). The
    output is bf16 and the weights' gradients fp32; each against float64 (forward, dx, dw, db),
    without autograd and through it, with eps by keyword, taking the kernels compiled for fp32
    (N,) tensors (`KernelFunction.vectors32`) and, from the second call, their C call."""
    from llmcompile import kernels
    from llmcompile.runtime import native_call

    gen = torch.Generator(device="cuda").manual_seed(3)
    n = shape[-1]
    x = torch.randn(shape, device="cuda", generator=gen).to(torch.bfloat16)
    w = torch.rand(n, device="cuda", generator=gen) + 0.5
    b = torch.randn(n, device="cuda", generator=gen)
    dy = torch.randn(shape, device="cuda", generator=gen).to(torch.bfloat16)
    params = [w] if op == "rmsnorm" else [w, b]
    ref = (
        (lambda t, *p: F.rms_norm(t, (n,), p[0], 1e-5))
        if op == "rmsnorm"
        else (lambda t, *p: F.layer_norm(t, (n,), *p, 1e-5))
    )
    leaves = [t.double().requires_grad_() for t in (x, *params)]
    want = ref(*leaves)
    want.backward(dy.double())
    fn = getattr(kernels, op)
    for _ in range(2):  # the second call: our C call's alternate
        got = fn(x, *params, eps=1e-5)
        assert got.dtype == torch.bfloat16 and got.shape == x.shape
        torch.testing.assert_close(got.double(), want.detach(), atol=2e-2, rtol=2e-2)
    assert fn.vectors32 is not None and fn.vectors32._plans
    if native_call.available():
        assert native_call.is_caller(fn.vectors32._given((torch.bfloat16, n, x.dim()), {"eps": 1e-5}))
    grads = [t.clone().requires_grad_() for t in (x, *params)]
    out = fn(*grads, eps=1e-5)
    out.backward(dy)
    torch.testing.assert_close(out.double(), want.detach(), atol=2e-2, rtol=2e-2)
    assert grads[0].grad.dtype == torch.bfloat16 and all(g.grad.dtype == torch.float32 for g in grads[1:])
    torch.testing.assert_close(grads[0].grad.double(), leaves[0].grad, atol=3e-2, rtol=3e-2)
    for g, leaf in zip(grads[1:], leaves[1:]):
        scale = leaf.grad.abs().max().item()
        torch.testing.assert_close(g.grad.double(), leaf.grad, atol=2e-3 * scale, rtol=1e-2)
    # .sum()'s gradient, one value: the one-value backward's kernel for fp32 (N,) tensors
    for t in (*grads, *leaves):
        t.grad = None
    fn(*grads, eps=1e-5).sum().backward()
    ref(*leaves).sum().backward()
    assert all(g.grad.dtype == torch.float32 for g in grads[1:])
    torch.testing.assert_close(grads[0].grad.double(), leaves[0].grad, atol=3e-2, rtol=3e-2)
    for g, leaf in zip(grads[1:], leaves[1:]):
        scale = leaf.grad.abs().max().item()
        torch.testing.assert_close(g.grad.double(), leaf.grad, atol=2e-3 * scale, rtol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("native", [True, False], ids=["cpp", "python"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_fused_cross_entropy_loss_matches_torch(
    dtype: torch.dtype, reduction: str, native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loss and its gradient from one pass (cross_entropy_fused_total) against F.cross_entropy, with
    ignored rows, leading dims, an upstream gradient of 1, one of 3, and one 0-d view at an offset no
    kernel takes (scale_ copies it); the C++ node and the Python Function."""
    monkeypatch.setattr(autograd, "NATIVE_NODES", native)
    gen = torch.Generator(device="cuda").manual_seed(2)
    for n in (1000, 128256):
        x = (torch.randn(2, 37, n, device="cuda", generator=gen) * 3).to(dtype)
        t = torch.randint(0, n, (2, 37), device="cuda", generator=gen)
        t[0, :5] = -100
        for upstream in (1.0, 3.0):
            ours, want = x.clone().requires_grad_(), x.double().requires_grad_()
            (autograd.cross_entropy_loss(ours, t, reduction=reduction) * upstream).backward()
            ref = F.cross_entropy(want.reshape(-1, n), t.reshape(-1), reduction=reduction) * upstream
            ref.backward()
            got = autograd.cross_entropy_loss(ours.detach(), t, reduction=reduction) * upstream
            torch.testing.assert_close(got.double(), ref.detach(), atol=1e-4, rtol=1e-4)
            atol, rtol = TOL[dtype]
            scale = upstream / (69 if reduction == "mean" else 1)  # a mean's gradients are 1/kept rows
            torch.testing.assert_close(ours.grad.double(), want.grad, atol=atol * scale, rtol=rtol)
            assert ours.grad.shape == x.shape and not ours.grad[0, :5].any()
        ours, want = x.clone().requires_grad_(), x.double().requires_grad_()
        autograd.cross_entropy_loss(ours, t, reduction=reduction).backward(torch.tensor([0.0, -2.0], device="cuda")[1])
        (F.cross_entropy(want.reshape(-1, n), t.reshape(-1), reduction=reduction) * -2.0).backward()
        scale = 2.0 / (69 if reduction == "mean" else 1)
        torch.testing.assert_close(ours.grad.double(), want.grad, atol=TOL[dtype][0] * scale, rtol=TOL[dtype][1])
        # a second backward of the same graph (retain_graph): dx was scaled in place by the first
        ours = x.clone().requires_grad_()
        loss = autograd.cross_entropy_loss(ours, t, reduction=reduction)
        loss.backward(retain_graph=True)
        first = ours.grad.clone()
        ours.grad = None
        (loss * 3.0).backward()
        torch.testing.assert_close(ours.grad.float(), 3.0 * first.float(), atol=1e-6, rtol=2e-2)


@pytest.mark.gpu
def test_fused_cross_entropy_loss_step_never_waits_for_the_device() -> None:
    """A training step's loss launches its forward and backward without a host sync: one would hold
    the step's backward until its forward has run (torch raises on a sync in this mode)."""
    x = torch.randn(64, 1000, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    t = torch.randint(0, 1000, (64,), device="cuda")
    autograd.cross_entropy_loss(x, t).backward()  # plans and compiles outside the check
    x.grad = None
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        (autograd.cross_entropy_loss(x, t) * 2.0).backward()
        autograd.cross_entropy_loss(x, t).backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    want = torch.func.grad(lambda v: 3.0 * F.cross_entropy(v, t))(x.detach().double())
    torch.testing.assert_close(x.grad.double(), want, atol=2e-3, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "op", ["softmax", "log_softmax", "rmsnorm", "layernorm", "rmsnorm fp32 weight", "rmsnorm fp32 weight alone"]
)
def test_a_planned_backward_launches_without_the_gil_as_through_python(op: str) -> None:
    """A step's forward and backward run the kernels planned for its rows from C++, the backward
    without the GIL (`forward_runs`' and `backward_runs`' first counts), for a dense upstream
    gradient and for .sum()'s one value; its gradients are those of the same step with the kernel
    functions called through Python, bit for bit. bf16 rows with leading dims; an fp32 weight beside
    them takes its own kernels, after a step with a bf16 weight at that N, and alone (at an N no
    other test plans: every call there has an fp32 weight)."""
    from llmcompile import kernels
    from llmcompile.runtime import autograd_native, native_call

    ext = autograd_native.module()
    assert ext is not None, autograd_native.reason()
    n = 1344 if op.endswith("alone") else 1024
    gen = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randn(3, 5, n, device="cuda", generator=gen).to(torch.bfloat16)
    w = (torch.rand(n, device="cuda", generator=gen) + 0.5).to(torch.float32 if "fp32" in op else torch.bfloat16)
    b = torch.randn(n, device="cuda", generator=gen).to(torch.bfloat16)
    dy = torch.randn(x.shape, device="cuda", generator=gen).to(torch.bfloat16)
    rms = lambda *t: kernels.rmsnorm(*t, eps=1e-5)  # noqa: E731
    fn, ins = {
        "softmax": (kernels.softmax, (x,)),
        "log_softmax": (kernels.log_softmax, (x,)),
        "rmsnorm": (rms, (x, w)),
        "layernorm": (kernels.layernorm, (x, w, b)),
        "rmsnorm fp32 weight": (rms, (x, w)),
        "rmsnorm fp32 weight alone": (rms, (x, w)),
    }[op]

    def step(dense: bool, ins: tuple[torch.Tensor, ...] = ins) -> tuple[torch.Tensor, ...]:
        leaves = [t.clone().requires_grad_() for t in ins]
        out = fn(*leaves)
        return torch.autograd.grad((out * dy).sum() if dense else out.sum() * 3.0, leaves)

    for dense in (True, False):
        if op == "rmsnorm fp32 weight":
            step(dense, (x, w.bfloat16()))
        step(dense)  # (plans the kernels for these rows)
        ext.set_native(None)
        try:
            through_python = step(dense)
        finally:
            ext.set_native(native_call.native_api())
        forward, backward = ext.forward_runs(), ext.backward_runs()
        without_gil = step(dense)
        assert ext.forward_runs() == (forward[0] + 1, forward[1])
        assert ext.backward_runs() == (backward[0] + 1, backward[1])
        for p, f in zip(through_python, without_gil):
            assert torch.equal(p, f)


@pytest.mark.gpu
def test_norm_backward_compiles_fullgraph() -> None:
    """torch.compile(fullgraph=True) through RMSNorm's and LayerNorm's forward and backward
    kernels (the torch.library ops inside the autograd Functions)."""
    from llmcompile import kernels

    x = torch.randn(64, 2048, device="cuda", requires_grad=True)
    w = (torch.rand(2048, device="cuda") + 0.5).requires_grad_()
    b = torch.randn(2048, device="cuda", requires_grad=True)
    for ours, ref in (
        (lambda: kernels.rmsnorm(x, w), lambda t, v: F.rms_norm(t, (2048,), v, 1e-6)),
        (lambda: kernels.layernorm(x, w, b), lambda t, v: F.layer_norm(t, (2048,), v, b.detach(), 1e-5)),
    ):
        x.grad = w.grad = None
        step = torch.compile(lambda fn=ours: (fn() ** 2).sum(), fullgraph=True)
        step().backward()
        xr, wr = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        (ref(xr, wr) ** 2).sum().backward()
        torch.testing.assert_close(x.grad, xr.grad, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(w.grad, wr.grad, atol=1e-3, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_fused_loss_compiles_fullgraph(reduction: str) -> None:
    """torch.compile(fullgraph=True) through cross_entropy_loss: the Python Function, its forward
    the fused-total torch.library op with its (1,) totals, its backward `scale` out of place."""
    x = torch.randn(3, 37, 1000, device="cuda", requires_grad=True)
    t = torch.randint(0, 1000, (3, 37), device="cuda")
    t[0, :4] = -100
    step = torch.compile(lambda v: autograd.cross_entropy_loss(v, t, reduction=reduction) * 3.0, fullgraph=True)
    loss = step(x)
    loss.backward()
    xr = x.detach().double().requires_grad_()
    want = F.cross_entropy(xr.reshape(-1, 1000), t.reshape(-1), reduction=reduction) * 3.0
    want.backward()
    torch.testing.assert_close(loss.double(), want.detach(), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(x.grad.double(), xr.grad, atol=1e-6, rtol=1e-4)


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
    """A 2-layer MLP with RMSNorm trained 100 steps with our RMSNorm and cross-entropy gives
    the loss curve of torch's RMSNorm and cross-entropy."""
    from llmcompile import kernels

    class OurRMSNorm(torch.nn.RMSNorm):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return kernels.rmsnorm(x, self.weight, self.eps)

    def curve(loss_fn, norm=torch.nn.RMSNorm) -> list[float]:  # noqa: ANN001
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(256, 512), torch.nn.GELU(), norm(512, eps=1e-6), torch.nn.Linear(512, 1000)
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

    ours = curve(kernels.cross_entropy, OurRMSNorm)
    want = curve(lambda logits, y: F.cross_entropy(logits, y, reduction="none"))
    assert ours[-1] < ours[0] * 0.7, ours[::10]  # it learns
    assert max(abs(a - b) for a, b in zip(ours, want)) < 1e-3 * max(want), (ours[::10], want[::10])


@pytest.mark.gpu
def test_a_training_steps_backward_takes_no_checked_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a training step calls (3-D activations, eps by keyword, a loss ended by .sum() or
    .mean(), whose upstream gradient arrives expanded): once each shape has run, no kernel call
    takes the checked path (the slow one: validation, copies, the compiled wrapper)."""
    from llmcompile import kernels

    checked: list[str] = []
    original = KernelFunction._checked_call

    def spy(self: KernelFunction, inputs: tuple, scalars: dict) -> object:
        checked.append(self.spec.name)
        return original(self, inputs, scalars)

    gen = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(2, 64, 1024, device="cuda", generator=gen, dtype=torch.bfloat16)
    w = torch.rand(1024, device="cuda", generator=gen, dtype=torch.bfloat16)
    logits = torch.randn(128, 512, device="cuda", generator=gen, dtype=torch.bfloat16)
    target = torch.randint(0, 512, (128,), device="cuda", generator=gen)

    def step() -> None:
        a = x.clone().requires_grad_()
        wa = w.clone().requires_grad_()
        kernels.rmsnorm(a, wa, eps=1e-5).sum().backward()
        kernels.softmax(a).sum().backward()
        b = logits.clone().requires_grad_()
        kernels.cross_entropy(b, target).sum().backward()
        kernels.cross_entropy(b, target).mean().backward()
        with torch.no_grad():
            kernels.rmsnorm(x, w, eps=1e-5), kernels.softmax(x), kernels.layernorm(x, w, w, eps=1e-5)

    step()  # (the first call of each shape is checked and plans it)
    monkeypatch.setattr(KernelFunction, "_checked_call", spy)
    step()
    torch.cuda.synchronize()
    assert checked == [], checked
