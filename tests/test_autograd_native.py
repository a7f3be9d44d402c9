"""CPU (CI): the row ops' C++ autograd nodes (runtime/autograd_native.py), built here with the
machine's C++ compiler against this torch, driven with stand-in kernel functions on CPU tensors
(the real ones run on the GPU: tests/test_autograd.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from llmcompile.runtime import autograd, autograd_native
from llmcompile.specs import references as ops


@pytest.fixture
def ext(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """The extension with stand-in kernel functions (float64 references on the CPU, which record
    their calls); the real kernel functions registered again afterwards."""
    monkeypatch.setattr(autograd, "NATIVE_NODES", True)  # (off by default until run on the H100)
    m = autograd_native.module()
    if m is None:
        pytest.fail(f"the C++ autograd nodes did not build on this machine: {autograd_native.reason()}")
    calls: list[tuple[str, dict]] = []

    def rec(name: str, fn: object) -> object:
        def call(*args: torch.Tensor, **kw: float) -> object:
            assert not torch.is_grad_enabled() or name.endswith("bwd")  # (a forward runs without grad)
            calls.append((name, kw))
            return fn(*args, **kw)

        return call

    def softmax_bwd(dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        assert dy.is_contiguous() and dy.dtype == y.dtype  # (an expanded gradient is made dense first)
        return y * (dy - (dy * y).sum(-1, keepdim=True))

    def log_softmax_bwd(dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return dy - y.exp() * dy.sum(-1, keepdim=True)

    # the kernel functions see leading dims as rows and give outputs back in the caller's shape
    def rows(ref: object, n_rows: int) -> object:
        def call(*args: torch.Tensor, **kw: float) -> list[torch.Tensor]:
            lead, n = args[0].shape[:-1], args[0].shape[-1]
            flat = [
                a.reshape(-1, n) if a.dim() > 1 and a.shape[-1] == n else a.reshape(-1) if a.shape == lead else a
                for a in args
            ]
            outs = ref(*flat, *kw.values())
            return [
                o.reshape(*lead, n) if i < n_rows else o.reshape(lead) if o.numel() == lead.numel() else o
                for i, o in enumerate(outs)
            ]

        return call

    m.register_op(m.SOFTMAX, rec("softmax", lambda x: torch.softmax(x, -1)), rec("softmax_bwd", softmax_bwd))
    m.register_op(
        m.LOG_SOFTMAX, rec("log_softmax", lambda x: torch.log_softmax(x, -1)), rec("log_softmax_bwd", log_softmax_bwd)
    )
    fwd_defaults = ({"eps": 1e-6}, {"eps": 1e-5})
    rms = rows(lambda x, w, eps=fwd_defaults[0]["eps"]: ops.ref_rmsnorm_fwd(x, w, eps), 1)
    ln = rows(lambda x, w, b, eps=fwd_defaults[1]["eps"]: ops.ref_layernorm_fwd(x, w, b, eps), 1)
    m.register_op(m.RMSNORM, rec("rmsnorm_fwd", rms), rec("rmsnorm_bwd", rows(ops.ref_rmsnorm_bwd, 1)))
    m.register_op(m.LAYERNORM, rec("layernorm_fwd", ln), rec("layernorm_bwd", rows(ops.ref_layernorm_bwd, 1)))
    m.calls = calls
    try:
        yield m
    finally:
        from llmcompile.runtime import compiled as kernels

        m.register_op(m.SOFTMAX, kernels.softmax, kernels.softmax_bwd)
        m.register_op(m.LOG_SOFTMAX, kernels.log_softmax, kernels.log_softmax_bwd)
        m.register_op(m.RMSNORM, kernels.rmsnorm_fwd, kernels.rmsnorm_bwd)
        m.register_op(m.LAYERNORM, kernels.layernorm_fwd, kernels.layernorm_bwd)


@pytest.mark.parametrize("log", [False, True])
def test_softmax_nodes_give_torchs_gradients(ext: object, log: bool) -> None:
    """A C++ node, not a Python Function: its gradient is torch's, for a dense upstream gradient and
    for .sum()'s expanded one, through leading dims."""
    x = torch.randn(2, 3, 33, dtype=torch.float64)
    dy = torch.randn(2, 3, 33, dtype=torch.float64)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    y = (autograd.log_softmax if log else autograd.softmax)(a)
    assert "Node" in y.grad_fn.name() and "Backward" not in type(y.grad_fn).__name__, y.grad_fn.name()
    want = (torch.log_softmax if log else torch.softmax)(b, -1)
    torch.testing.assert_close(y, want)
    (ga,) = torch.autograd.grad(y, a, dy, retain_graph=True)
    (gb,) = torch.autograd.grad(want, b, dy, retain_graph=True)
    torch.testing.assert_close(ga, gb)
    (ga,) = torch.autograd.grad(y.sum(), a)
    (gb,) = torch.autograd.grad(want.sum(), b)
    torch.testing.assert_close(ga, gb)
    name = "log_softmax" if log else "softmax"
    assert [c for c, _ in ext.calls] == [name, f"{name}_bwd", f"{name}_bwd"]


@pytest.mark.parametrize("eps", [None, 1e-5])
def test_norm_nodes_give_torchs_gradients(ext: object, eps: float | None) -> None:
    """RMSNorm and LayerNorm nodes: out, dx, dw (and db) against torch's autograd in float64; eps
    reaches the forward kernel by keyword only where it is not the kernel's default."""
    x = torch.randn(4, 5, 40, dtype=torch.float64)
    w, b = torch.rand(40, dtype=torch.float64) + 0.5, torch.randn(40, dtype=torch.float64)
    dy = torch.randn(4, 5, 40, dtype=torch.float64)
    kw = {} if eps is None else {"eps": eps}
    for ours, theirs, params, default in (
        (autograd.rmsnorm, lambda t, *p: F.rms_norm(t, (40,), p[0], eps or 1e-6), (w,), 1e-6),
        (autograd.layernorm, lambda t, *p: F.layer_norm(t, (40,), *p, eps or 1e-5), (w, b), 1e-5),
    ):
        ext.calls.clear()
        mine = [t.clone().requires_grad_() for t in (x, *params)]
        ref = [t.clone().requires_grad_() for t in (x, *params)]
        out = ours(*mine, **kw)
        want = theirs(*ref)
        torch.testing.assert_close(out, want)
        for g, r in zip(torch.autograd.grad(out, mine, dy), torch.autograd.grad(want, ref, dy)):
            torch.testing.assert_close(g, r)
        (fwd_name, fwd_kw), (bwd_name, _) = ext.calls
        assert fwd_name.endswith("_fwd") and bwd_name.endswith("_bwd")
        assert fwd_kw == ({} if eps in (None, default) else {"eps": eps}), (fwd_name, fwd_kw)
        # a non-contiguous x is saved dense, as the kernels read it
        xt = x.transpose(0, 1).contiguous().transpose(0, 1).requires_grad_()
        torch.testing.assert_close(ours(xt, *params, **kw), theirs(x, *params))


def test_functorch_and_compile_keep_the_python_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under functorch transforms (and while torch.compile traces) the Python Functions take the
    call: they are what those systems know how to see through."""
    monkeypatch.setattr(autograd, "NATIVE_NODES", True)
    seen: list[object] = []

    def f(t: torch.Tensor) -> torch.Tensor:
        seen.append(autograd._nodes(t))
        return (t * t).sum()

    torch.func.grad(f)(torch.randn(3))
    assert seen == [None]
    assert autograd._nodes(torch.randn(3)) is autograd_native.module() is not None
    monkeypatch.setattr(autograd, "NATIVE_NODES", False)  # the default: the Python Functions
    assert autograd._nodes(torch.randn(3)) is None
