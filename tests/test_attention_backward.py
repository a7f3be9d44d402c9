"""The attention's differentiable call (`autograd.attention`) and its backward, torch's attention
backward kernel on our o and lse (`runtime/attention_backward.py`)."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

from llmcompile.runtime import attention_backward as AB
from llmcompile.runtime import autograd, fixed_layout
from llmcompile.specs.attention import ref_attention


def test_every_attention_kernel_function_is_differentiable() -> None:
    from llmcompile import kernels

    for fn in (kernels.attention, kernels.attention_causal, kernels.attention_d64, kernels.attention_causal_d64):
        assert fn.grad_fn is not None, fn.spec.name


def test_the_backend_is_asked_once_a_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple] = []
    monkeypatch.setattr(AB, "_PICKED", {})
    monkeypatch.setattr(torch, "_fused_sdp_choice", lambda q, *_, **__: asked.append(q.stride()) or 0)
    q = torch.zeros(2, 4, 16, 8)
    v = torch.zeros(2, 16, 4, 8).transpose(1, 2)
    assert [AB.backend(q, q, t, True, 0.5) for t in (q, v, q, v)] == [0] * 4 and len(asked) == 2
    torch.backends.cuda.enable_flash_sdp(not torch.backends.cuda.flash_sdp_enabled())
    try:  # (another set of enabled backends, as `sdpa_kernel` makes: asked again)
        AB.backend(q, q, q, True, 0.5)
    finally:
        torch.backends.cuda.enable_flash_sdp(not torch.backends.cuda.flash_sdp_enabled())
    assert len(asked) == 3


@pytest.mark.parametrize("heads", [False, True], ids=["bh-s-d", "b-h-s-d"])
@pytest.mark.parametrize("causal, compiled", [(False, False), (True, False), (True, True)])
def test_gradients_are_sdpas_where_no_fused_kernel_takes_the_tensors(causal: bool, compiled: bool, heads: bool) -> None:
    """A float64 stand-in for the forward kernel, on the CPU (no fused backward kernel there: SDPA's
    forward and backward run again): o and lse from the kernel function, the lse with no gradient,
    SDPA's gradients, under torch.compile too; a strided q made dense for the kernel; the call's
    scale reaching both; (batch x heads, s, d) and SDPA's (batch, heads, s, d), the kernel seeing
    the latter as the former."""
    seen: list[float] = []

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float = 0.125) -> list[torch.Tensor]:
        assert all(t.is_contiguous() and t.shape == (6, 20, 8) for t in (q, k, v))
        if not compiled:  # (dynamo refuses a side effect inside an autograd.Function it traces)
            seen.append(scale)
        return ref_attention(causal)(q, k, v, scale)

    call = autograd.attention(fn, causal, 0.125)
    call = torch.compile(call) if compiled else call
    lead = (2, 3) if heads else (6,)
    # q strided: the model's layout of a projection's heads, (b, s, h, d) seen as (b, h, s, d)
    q = torch.randn(20, *lead, 8, dtype=torch.float64).movedim(0, -2).requires_grad_()
    k, v = (torch.randn(*lead, 20, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    dy = torch.randn(20, *lead, 8, dtype=torch.float64).movedim(0, -2)  # (a transposed view, as a model's)
    for kw in ({}, {"scale": 0.3}):
        o, lse = call(q, k, v, **kw)
        assert o.requires_grad and not lse.requires_grad and lse.shape == (*lead, 20)
        if not compiled:  # (the C++ node where it is built; a scale by keyword, the Python Function)
            node = not kw and autograd._nodes(q) is not None
            assert o.grad_fn.name() == ("llmcompile::AttentionNode" if node else "AttentionFunctionBackward")
        want = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=kw.get("scale", 0.125))
        torch.testing.assert_close(o, want)
        for g, r in zip(torch.autograd.grad(o, (q, k, v), dy), torch.autograd.grad(want, (q, k, v), dy)):
            torch.testing.assert_close(g, r)
    assert seen == ([] if compiled else [0.125, 0.3])


@pytest.mark.gpu
@pytest.mark.parametrize("allowed", ["default", "flash", "math"])
def test_our_forward_feeds_torchs_backward_as_well_as_sdpa_does(allowed: str) -> None:
    """kernels.attention_causal_d64 and attention_d64 through autograd: gradients as near float64's
    as SDPA's own, through cuDNN's backward (where torch picks it), flash-attention's, and SDPA's
    math path run again (`sdpa_kernel` allowing only it); an lse of the wrong base, layout or scale
    puts them far off."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from llmcompile import kernels

    only = {"flash": [SDPBackend.FLASH_ATTENTION], "math": [SDPBackend.MATH]}.get(allowed)
    route = {"flash": (AB.FLASH,), "math": (SDPBackend.MATH.value,)}.get(allowed, (AB.CUDNN, AB.FLASH))
    torch.manual_seed(0)
    m, n, d = 6, 384, 64
    q, k, v, dy = (torch.randn(m, n, d, device="cuda") for _ in range(4))
    for fn, causal in ((kernels.attention_causal_d64, True), (kernels.attention_d64, False)):

        def grads(f, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:  # noqa: ANN001
            x = [t.to(dtype).requires_grad_() for t in (q, k, v)]
            return torch.autograd.grad(f(*x), x, dy.to(dtype))

        def sdpa(*x: torch.Tensor) -> torch.Tensor:
            return F.scaled_dot_product_attention(*x, is_causal=causal)  # noqa: B023

        with sdpa_kernel(only) if only else contextlib.nullcontext():
            ours = grads(lambda *x: fn(*x)[0], torch.bfloat16)  # noqa: B023
            qkv = [t.to(torch.bfloat16).unsqueeze(0) for t in (q, k, v)]
            assert AB.backend(*qkv, causal, d**-0.5) in route, allowed
        ref, theirs = grads(sdpa, torch.float64), grads(sdpa, torch.bfloat16)
        for name, o, t, r in zip("qkv", ours, theirs, ref):
            err_o, err_t = ((g.double() - r).abs().max().item() for g in (o, t))
            assert err_o <= 2 * err_t + 1e-2, (fn.spec.name, name, err_o, err_t)


@pytest.mark.parametrize("layout", ["strided", "refused"])
def test_the_python_function_reads_a_models_v_where_it_lies(monkeypatch: pytest.MonkeyPatch, layout: str) -> None:
    """The Python Function (LLMCOMPILE_NATIVE_AUTOGRAD=0) on SDPA's 4-D call, v a transposed view of a
    (b, s, h, d) projection: the kernel function's strided-v call gets v itself and writes o (b, h, s,
    d); where that call refuses the layout (None), v is copied for the 3-D call. o and the gradients
    (SDPA's backward on the CPU) are SDPA's either way, with and without grad."""
    monkeypatch.setattr(autograd, "NATIVE_NODES", False)
    calls: list[str] = []

    class Fn:
        def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> list[torch.Tensor]:
            calls.append("3-D")
            assert all(t.is_contiguous() and t.shape == (6, 20, 8) for t in (q, k, v))
            return ref_attention(True)(q, k, v, 0.125)

        def strided_v_call(
            self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor
        ) -> torch.Tensor | None:
            calls.append("strided")
            assert v.data_ptr() == v_in.data_ptr() and v.stride() == v_in.stride() and o.shape == (2, 3, 20, 8)
            if layout == "refused":
                return None
            o3, lse = ref_attention(True)(q, k, v.reshape(6, 20, 8), 0.125)
            o.copy_(o3.view(o.shape))
            return lse

    call = autograd.attention(Fn(), True, 0.125)
    q, k = (torch.randn(2, 3, 20, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    v_in = torch.randn(2, 20, 3, 8, dtype=torch.float64).transpose(1, 2).requires_grad_()
    dy = torch.randn(2, 3, 20, 8, dtype=torch.float64)
    want = F.scaled_dot_product_attention(q, k, v_in, is_causal=True, scale=0.125)
    with monkeypatch.context() as m:  # (the forward's stand-ins on the CPU; the backward is SDPA's math)
        m.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
        o, lse = call(q, k, v_in)
        with torch.no_grad():
            o_nograd, _ = call(q, k, v_in)
    assert o.grad_fn.name() == "AttentionFunctionBackward" and lse.shape == (2, 3, 20)
    assert calls == (["strided"] if layout == "strided" else ["strided", "3-D"]) * 2
    torch.testing.assert_close(o, want)
    for g, r in zip(torch.autograd.grad(o, (q, k, v_in), dy), torch.autograd.grad(want, (q, k, v_in), dy)):
        torch.testing.assert_close(g, r)
    torch.testing.assert_close(o_nograd, want)


@pytest.mark.gpu
@pytest.mark.parametrize("allowed", ["any", "flash"])
@pytest.mark.parametrize(
    ("op", "n", "d"), [("attention_causal_d64", 256, 64), ("attention_causal_d64", 1000, 64), ("attention", 384, 128)]
)
def test_sdpas_layout_is_the_same_call(op: str, n: int, d: int, allowed: str) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    # (torch picks cuDNN's backward on an H200; `sdpa_kernel` allowing flash alone takes the other)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]) if allowed == "flash" else contextlib.nullcontext():
        _check_sdpas_layout(op, n, d)


def _check_sdpas_layout(op: str, n: int, d: int) -> None:
    """An attention kernel function on (b, h, s, d) q, k, v (v a transposed view, as a model's
    projection makes it), with and without grad: o, lse and the gradients are those of the same
    call on (b·h, s, d) dense copies: o and lse bit for bit, the gradients to bf16 rounding (torch's
    backward kernels may accumulate dq with atomics). Through autograd's C++ node, v is read where it
    lies (`strided_v_call`, the kernel compiled for v and o at run-time strides), a partial tile
    included; where the backward is flash-attention's, o is written (b, s, h, d) in memory, as its
    backward reads it, for a dense v too."""
    from llmcompile import kernels

    fn = getattr(kernels, op)
    torch.manual_seed(0)
    q, k = (torch.randn(2, 3, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(2, n, 3, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    # (the upstream gradient a transposed view, as a model's: torch's kernel reads it so)
    dy = torch.randn(2, n, 3, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    flat = [t.reshape(6, n, d).contiguous() for t in (q, k, v)]
    o3, lse3 = fn(*flat)
    ext = autograd._nodes(q)
    runs = ext.strided_v_runs() if ext is not None else 0
    o4, lse4 = fn(q, k, v)  # (without grad too, the node's call reads v where it lies: `_strided_v_heads`)
    assert ext is None or ext.strided_v_runs() == runs + fixed_layout.STRIDED_V
    assert o4.is_contiguous() and torch.equal(o4, o3.view(2, 3, n, d)) and torch.equal(lse4, lse3.view(2, 3, n))
    from llmcompile.runtime import native_call

    if native_call.available():  # (the fixed-layout call in C, made by the shape's first call, took the second)
        assert native_call.is_caller(fn.fixed_caller(flat[0]))
    leaves4 = [t.detach().requires_grad_() for t in (q, k, v)]
    leaves3 = [t.detach().requires_grad_() for t in flat]
    runs = ext.strided_v_runs() if ext is not None else 0
    o4, lse4 = fn(*leaves4)
    assert ext is None or o4.grad_fn.name() == "llmcompile::AttentionNode"
    flash = AB.backend(q, k, v, "causal" in op, d**-0.5) == AB.FLASH
    if ext is not None:  # (v was not copied: the strided-v kernel's output, the dense one's bits)
        assert ext.strided_v_runs() == runs + 1
        assert torch.equal(o4.detach(), o3.view(2, 3, n, d)) and torch.equal(lse4, lse3.view(2, 3, n))
        assert o4.transpose(1, 2).is_contiguous() == flash, (flash, o4.stride())
        dense = [t.detach().contiguous().requires_grad_() for t in (q, k, v)]
        o_dense, _ = fn(*dense)
        assert ext.strided_v_runs() == runs + 1 + flash and torch.equal(o_dense.detach(), o4.detach())
        assert o_dense.transpose(1, 2).is_contiguous() == flash
    g4 = torch.autograd.grad(o4, leaves4, dy)
    g3 = torch.autograd.grad(fn(*leaves3)[0], leaves3, dy.reshape(6, n, d))
    for a, b, leaf in zip(g4, g3, leaves4):
        assert a.shape == leaf.shape
        torch.testing.assert_close(a, b.view(leaf.shape), atol=1e-2, rtol=1e-2)
