"""CPU (CI): attention's call forms (`runtime/fixed_layout.py`): SDPA's 4-D tensors seen as M, a
model's strided v read where it lies, and the calls in C the attention's C++ node keeps."""

from __future__ import annotations

import pytest
import torch

from llmcompile.runtime.callpath import KernelFunction
from llmcompile.specs import get_op


def test_attention_takes_sdpas_batch_and_heads_as_its_m() -> None:
    """(batch, heads, s, d) inputs, as SDPA's: seen as (batch x heads, s, d), a view where the two
    dims merge and a copy where not (v transposed from a projection's (b, s, h, d)), the outputs
    given back (b, h, ...); any other rank is not this path's."""
    fn = KernelFunction(get_op("attention_causal_d64"), lambda dtype, n: "kernel")
    seen: list[tuple[torch.Tensor, ...]] = []

    def call(ins: tuple[torch.Tensor, ...], scalars: dict) -> list[torch.Tensor]:
        seen.append(ins)
        return [torch.zeros(ins[0].shape), torch.zeros(ins[0].shape[:2])]

    q = torch.randn(2, 3, 16, 64)
    v = torch.randn(2, 16, 3, 64).transpose(1, 2)
    o, lse = fn._heads_call((q, q, v), {}, call)
    assert o.shape == (2, 3, 16, 64) and lse.shape == (2, 3, 16)
    ((q3, _, v3),) = seen
    assert q3.shape == v3.shape == (6, 16, 64) and q3.data_ptr() == q.data_ptr() and v3.is_contiguous()
    assert torch.equal(v3, v.reshape(6, 16, 64))
    assert fn._heads_call((q[0], q[0], q[0]), {}, call) is None and len(seen) == 1


def test_an_eager_4d_attention_hands_a_models_v_to_its_differentiable_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """SDPA's 4-D call without grad, v a transposed (b, h, s, d) view of a (b, s, h, d) projection:
    given as it is to the op's differentiable call (the C++ node's or the Python Function's, which
    read such a v where it lies, with or without grad); a dense v, scalars by keyword, the traced
    call, or a CPU q take the 3-D call on a copy as before."""
    fn = KernelFunction(get_op("attention_causal_d64"), lambda dtype, n: "kernel")
    handed: list[tuple[torch.Tensor, ...]] = []
    fn.grad_fn = lambda *ins: handed.append(ins) or (torch.zeros(ins[0].shape), torch.zeros(ins[0].shape[:3]))
    seen: list[tuple[torch.Tensor, ...]] = []

    def call(ins: tuple[torch.Tensor, ...], scalars: dict) -> list[torch.Tensor]:
        seen.append(ins)
        return [torch.zeros(ins[0].shape), torch.zeros(ins[0].shape[:2])]

    q, k = (torch.randn(2, 3, 16, 64) for _ in range(2))
    v = torch.randn(2, 16, 3, 64).transpose(1, 2)
    fn._heads_call((q, k, v), {}, call, strided_v=True)  # (a CPU q)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))  # (stand-ins on the CPU)
    o, lse = fn._heads_call((q, k, v), {}, call, strided_v=True)
    assert o.shape == (2, 3, 16, 64) and lse.shape == (2, 3, 16) and len(seen) == 1
    assert len(handed) == 1 and handed[0][2] is v
    fn._heads_call((q, k, v), {"scale": 0.5}, call, strided_v=True)
    fn._heads_call((q, k, v.contiguous()), {}, call, strided_v=True)
    fn._heads_call((q, k, v), {}, call)  # (the traced call: torch ops only)
    assert len(seen) == 4 and len(handed) == 1 and all(ins[2].is_contiguous() for ins in seen)


def test_the_fixed_layout_call_in_c_is_made_once_and_found_for_its_shape_only() -> None:
    """A fixed-layout op (attention: q, k, v and o of (M, N, D), lse (M, N)) gets its call in C
    from its outputs' shapes ("all" and "lead" of q); `fixed_caller` finds it for q's shape and
    dtype, never for another head dim (the key holds M and N only)."""
    tvm_ffi = pytest.importorskip("tvm_ffi")
    from llmcompile.runtime import fixed_layout, native_call

    fn = KernelFunction(get_op("attention_causal_d64"), lambda dtype, n: "kernel")
    ins = [((6, 16, 64), torch.bfloat16)] * 3
    outs = [((6, 16, 64), torch.bfloat16), ((6, 16), torch.float32)]
    caller = fixed_layout.make_fixed_caller(tvm_ffi.convert(lambda *_: None), ins, outs, (0.125,))
    assert native_call.is_caller(caller)
    assert fixed_layout.make_fixed_caller(tvm_ffi.convert(lambda *_: None), ins, [((6, 8), torch.float32)], ()) is None
    assert fixed_layout.make_fixed_caller("not a TVM-FFI function", ins, outs, (0.125,)) is None
    fn._fixed[(torch.bfloat16, 6, 16)] = [ins, outs, "kernel", "bfloat16", caller]
    assert fn.fixed_caller(torch.empty(6, 16, 64, dtype=torch.bfloat16)) is caller
    assert fn.fixed_caller(torch.empty(6, 16, 128, dtype=torch.bfloat16)) is None
    assert fn.fixed_caller(torch.empty(6, 16, 64, dtype=torch.float16)) is None
    assert fn.fixed_caller(torch.empty(6, 20, 64, dtype=torch.bfloat16)) is None


def test_an_attentions_strided_v_is_read_where_it_lies_where_its_layout_allows(monkeypatch: pytest.MonkeyPatch) -> None:
    """`strided_v_call` (the attention node's forward for SDPA's 4-D tensors; a model's v is a
    transposed (b, h, s, d) view): the kernel compiled for v and o at run-time strides gets v
    itself, q and k dense, the caller's o (here laid out as (b, s, h, d), as flash-attention's
    backward reads it), lse made for it, the op's default scale; compiled once per (dtype, N), the
    layout decided once. None where it cannot take the call (the node then copies v dense): strides
    not whole 16 bytes, b x h not q's M, an o of another shape, another dtype, an unaligned q, no such
    kernel, LLMCOMPILE_STRIDED_V=0."""
    from llmcompile.runtime import fixed_layout

    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))  # (stand-ins on the CPU)
    ran: list[tuple] = []
    compiled: list[tuple[str, int]] = []

    def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, scale: float):
        ran.append((v.data_ptr(), v.stride(), o.data_ptr(), o.stride(), lse.shape, lse.dtype, scale))

    def compile_strided(dtype: str, n: int) -> object:
        compiled.append((dtype, n))
        return kernel

    spec = get_op("attention_causal_d64")
    fn = KernelFunction(spec, lambda dtype, n: "kernel", compile_strided=compile_strided)
    bf16 = torch.bfloat16
    q, k = (torch.randn(6, 16, 64, dtype=bf16) for _ in range(2))
    v = torch.randn(2, 16, 3, 64, dtype=bf16).transpose(1, 2)  # (b, h, s, d) of a (b, s, h, d) projection
    o = torch.empty(2, 16, 3, 64, dtype=bf16).transpose(1, 2)
    for _ in range(2):
        lse = fn.strided_v_call(q, k, v, o)
        assert lse.shape == (6, 16) and lse.dtype == torch.float32
    assert compiled == [("bfloat16", 16)] and len(ran) == 2
    assert ran[0] == (v.data_ptr(), v.stride(), o.data_ptr(), o.stride(), (6, 16), torch.float32, 0.125)
    assert fn.strided_v_call(q, k, v, o.contiguous()) is not None  # (a dense o: cuDNN's layout)
    odd = torch.randn(2, 16, 3, 72, dtype=bf16)[..., 4:68].transpose(1, 2)  # (its rows 8-byte aligned)
    assert fn.strided_v_call(q, k, odd, o) is None
    assert fn.strided_v_call(q, k, v, odd) is None
    assert fn.strided_v_call(q, k, v[:1], o) is None
    assert fn.strided_v_call(q, k, v, o[:1]) is None
    assert fn.strided_v_call(q.half(), k.half(), v, o) is None
    unaligned = torch.randn(6 * 16 * 64 + 1, dtype=bf16)[1:].view(6, 16, 64)
    assert fn.strided_v_call(unaligned, k, v, o) is None
    assert len(ran) == 3 and compiled == [("bfloat16", 16)]
    assert KernelFunction(spec, lambda dtype, n: "kernel").strided_v_call(q, k, v, o) is None
    assert fn.strided_v_caller(q, k, v, o) is None  # (a Python stand-in: no call in C is made of it)
    monkeypatch.setattr(fixed_layout, "STRIDED_V", False)
    assert fn.strided_v_call(q, k, v, o) is None and len(ran) == 3


def test_the_strided_v_call_in_c_is_made_for_its_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """`strided_v_caller`: the strided-v kernel (a TVM-FFI stand-in) as a call in C taking q, k, v and
    the caller's o, whose output, lse of q's leading dims, is made there; None for a layout the
    kernel cannot take."""
    tvm_ffi = pytest.importorskip("tvm_ffi")
    from llmcompile.runtime import native_call

    if not native_call.available():
        pytest.skip(f"native_call did not build here: {native_call.reason()}")
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))  # (stand-ins on the CPU)
    seen: list[tuple] = []
    kernel = tvm_ffi.convert(
        lambda q, k, v, o, lse, scale: seen.append((tuple(v.strides), tuple(o.strides), tuple(lse.shape), scale))
    )
    fn = KernelFunction(get_op("attention_causal_d64"), lambda dtype, n: "kernel", compile_strided=lambda *_: kernel)
    q, k = (torch.randn(6, 16, 64, dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(2, 16, 3, 64, dtype=torch.bfloat16).transpose(1, 2)
    o = torch.empty(2, 16, 3, 64, dtype=torch.bfloat16).transpose(1, 2)
    caller = fn.strided_v_caller(q, k, v, o)
    assert native_call.is_caller(caller)
    lse = caller(q, k, v, o)  # (one output: itself)
    assert lse.shape == (6, 16) and lse.dtype == torch.float32
    assert seen == [(v.stride(), o.stride(), (6, 16), 0.125)]
    assert fn.strided_v_caller(q, k, v[:1], o) is None
