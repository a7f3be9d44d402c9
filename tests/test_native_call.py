"""CPU (CI): the call whose outputs are made in C, built here with the machine's C compiler and
driven through TVM-FFI on CPU tensors (torch's allocator serves them as it serves CUDA ones)."""

from __future__ import annotations

import ctypes
import sys

import pytest
import torch

from llmcompile.runtime import native_call
from llmcompile.runtime.callpath import KernelFunction
from llmcompile.runtime.native_call import OutputSpec
from llmcompile.specs import OpError, get_op

tvm_ffi = pytest.importorskip("tvm_ffi")


@pytest.fixture(autouse=True)
def _built() -> None:
    if not native_call.available():
        pytest.fail(f"native_call did not build on this machine: {native_call.reason()}")


def _torch(t: object) -> torch.Tensor:
    """A torch tensor over the memory of a tensor a kernel was handed: the C call hands DLTensor
    views (what a compiled kernel reads), which a Python stand-in reads by address (CPU only)."""
    dtype = getattr(torch, str(t.dtype))
    size = t.numel() * torch.empty((), dtype=dtype).element_size()
    buf = (ctypes.c_byte * size).from_address(t.data_ptr())
    return torch.frombuffer(buf, dtype=dtype).view(tuple(t.shape))


def _tensors(args: tuple) -> list[torch.Tensor]:
    return [_torch(a) for a in args if isinstance(a, tvm_ffi.Tensor)]


class _Kernel:
    """Stands in for a compiled kernel: writes out = x * 2 + the scalars, rows = row sums."""

    def __init__(self, n_in: int = 1, refuse: bool = False) -> None:
        self.calls: list[tuple] = []
        self.n_in = n_in
        self.refuse = refuse

    def __call__(self, *args: object) -> None:
        self.calls.append(args)
        if self.refuse:
            raise ValueError("Mismatched Tensor on argument #0")
        x, outs = _torch(args[0]), _tensors(args)[self.n_in :]
        scalars = [a for a in args if not isinstance(a, tvm_ffi.Tensor)]
        for o in outs:
            if o.dim() == 2:
                o.copy_(x * 2 + sum(scalars))
            else:
                o.copy_(x.sum(-1))


def test_one_output_is_made_in_c_and_comes_back_as_a_torch_tensor() -> None:
    k = _Kernel()
    call = native_call.make_caller(tvm_ffi.convert(k), 1, [OutputSpec(0, "all", "bfloat16")])
    x = torch.randn(5, 16, dtype=torch.bfloat16)
    y = call(x)
    assert isinstance(y, torch.Tensor) and y.shape == x.shape and y.dtype == torch.bfloat16
    assert torch.equal(y, x * 2) and y.data_ptr() != x.data_ptr()
    assert call(x).data_ptr() != x.data_ptr() and len(k.calls) == 2


def test_outputs_take_their_dtype_and_rows_and_the_scalars_follow_them() -> None:
    k = _Kernel(n_in=2)
    outs = [OutputSpec(0, "all", "float32"), OutputSpec(0, "first", "float32")]
    call = native_call.make_caller(tvm_ffi.convert(k), 2, outs, (0.5, 2))
    x, w = torch.randn(3, 8), torch.randn(8)
    y, rows = call(x, w)
    assert y.shape == (3, 8) and rows.shape == (3,) and rows.dtype == torch.float32
    assert torch.allclose(y, x * 2 + 2.5) and torch.allclose(rows, x.sum(-1))
    (args,) = k.calls
    assert len(args) == 6 and args[4] == 0.5 and args[5] == 2


def test_an_output_of_one_value_is_made_1_long_whatever_the_leading_dims() -> None:
    """A total (a loss's sum, mean, 1/kept) is an output of one value: made (1,) in C, not flattened
    with x's leading dims, beside rows made in the caller's shape."""
    seen: list[tuple] = []

    def kernel(x: object, y: object, total: object) -> None:
        seen.append((tuple(x.shape), tuple(y.shape), tuple(total.shape)))
        _torch(y).copy_(_torch(x) * 2)
        _torch(total).copy_(_torch(x).sum().reshape(1))

    outs = [OutputSpec(0, "all", "float32"), OutputSpec(0, "one", "float32")]
    call = native_call.make_caller(tvm_ffi.convert(kernel), 1, outs, flat=("rows",))
    x = torch.randn(2, 3, 8)
    y, total = call(x)
    assert seen == [((6, 8), (6, 8), (1,))] and y.shape == x.shape and total.shape == (1,)
    torch.testing.assert_close(total, x.sum().reshape(1))


def test_a_fixed_layouts_outputs_keep_their_dims() -> None:
    """A fixed layout's call (attention's: q, k, v taken as they are): o made like q, not flattened
    to rows, and lse of q's dims but the last ("lead"); the scalar follows the outputs."""
    seen: list[tuple] = []

    def kernel(q: object, k: object, v: object, o: object, lse: object, scale: float) -> None:
        seen.append((tuple(q.shape), tuple(o.shape), tuple(lse.shape), str(lse.dtype), scale))
        _torch(o).copy_(_torch(v) * scale)
        _torch(lse).copy_(_torch(q).float().sum(-1))

    outs = [OutputSpec(0, "all", "bfloat16"), OutputSpec(0, "lead", "float32")]
    call = native_call.make_caller(tvm_ffi.convert(kernel), 3, outs, (0.5,), (), ("none",) * 3, ("bfloat16",) * 3)
    q, k, v = (torch.randn(6, 16, 8, dtype=torch.bfloat16) for _ in range(3))
    o, lse = call(q, k, v)
    assert seen == [((6, 16, 8), (6, 16, 8), (6, 16), "float32", 0.5)]
    assert o.shape == q.shape and lse.shape == (6, 16) and lse.dtype == torch.float32
    assert torch.equal(o, v * 0.5) and torch.equal(lse, q.float().sum(-1))


def test_calls_it_cannot_take_are_refused_before_any_allocation() -> None:
    k = _Kernel()
    call = native_call.make_caller(tvm_ffi.convert(k), 1, [OutputSpec(0, "all", "float32")])
    with pytest.raises(TypeError, match="number of inputs"):
        call(torch.randn(2, 4), torch.randn(2, 4))
    with pytest.raises(TypeError, match="must be a torch tensor"):
        call(3)
    with pytest.raises(ValueError, match="empty or too large"):
        call(torch.empty(0, 4))
    assert not k.calls
    refusing = native_call.make_caller(tvm_ffi.convert(_Kernel(refuse=True)), 1, [OutputSpec(0, "all", "float32")])
    with pytest.raises(ValueError, match="Mismatched Tensor"):  # the kernel's own error comes back
        refusing(torch.randn(2, 4))


def test_bad_specs_are_refused_when_the_caller_is_made() -> None:
    fn = tvm_ffi.convert(_Kernel())
    with pytest.raises(ValueError, match="bad output spec"):
        native_call.make_caller(fn, 1, [OutputSpec(1, "all", "float32")])  # no input 1
    with pytest.raises(TypeError, match="make_caller"):
        native_call.make_caller("not a function", 1, [OutputSpec(0, "all", "float32")])


def test_a_kernel_function_calls_a_tvm_ffi_kernel_through_c() -> None:
    k = _Kernel(n_in=2)
    fn = KernelFunction(get_op("rmsnorm"), lambda dtype, n: tvm_ffi.convert(k))
    fn._plan("float32", 16)
    assert native_call.is_caller(fn._fast[(torch.float32, 16, 2)])
    x, w = torch.randn(4, 16), torch.randn(16)
    out = fn(x, w)
    assert isinstance(out, torch.Tensor) and out.shape == (4, 16)
    assert torch.allclose(out, x * 2 + 1e-6)  # rmsnorm's eps follows the output
    (args,) = k.calls
    assert len(args) == 4 and args[3] == pytest.approx(1e-6)


def test_a_call_the_kernel_refuses_in_c_is_taken_again_on_the_checked_path() -> None:
    k = _Kernel(refuse=True)
    fn = KernelFunction(get_op("softmax"), lambda dtype, n: tvm_ffi.convert(k))
    fn._plan("float32", 16)
    with pytest.raises(OpError, match="CUDA device"):  # the checked path's word
        fn(torch.randn(4, 16))
    assert len(k.calls) == 1


def test_python_stand_ins_keep_the_python_allocation() -> None:
    fn = KernelFunction(get_op("softmax"), lambda dtype, n: _Kernel())
    fn._plan("float32", 16)
    assert not native_call.is_caller(fn._fast[(torch.float32, 16, 2)])


def test_the_library_is_built_once_into_the_cache(tmp_path) -> None:  # noqa: ANN001
    path = tmp_path / "nc.so"
    native_call.build(path)
    assert path.is_file() and not [p for p in tmp_path.iterdir() if p != path]  # no temporary left
    mod = native_call.load(path)
    assert mod.Caller is not None and mod.Entry is not None


def test_a_bound_workspace_follows_the_outputs_and_per_column_outputs_take_n() -> None:
    seen: list[tuple] = []

    def kernel(x: object, colsum: object, ws: object, scale: float) -> None:
        seen.append((x, colsum, ws.data_ptr(), scale))  # (views: valid during the call only)
        _torch(colsum).copy_(_torch(x).sum(0) * scale)

    ws = torch.zeros(32)
    call = native_call.make_caller(tvm_ffi.convert(kernel), 1, [OutputSpec(0, "last", "float32")], (3.0,), (ws,))
    x = torch.randn(5, 8)
    ws_ptr = ws.data_ptr()
    del ws  # the caller holds it
    out = call(x)
    assert out.shape == (8,) and torch.allclose(out, x.sum(0) * 3)
    ((_, _, got_ws, scale),) = seen
    assert got_ws == ws_ptr and scale == 3.0


def test_a_kernel_with_a_workspace_binds_the_one_its_checked_call_made() -> None:
    from llmcompile.specs.contract import WithWorkspace

    calls: list[int] = []

    def kernel(*args: object) -> None:
        calls.append(len(args))

    wrapped = WithWorkspace(tvm_ffi.convert(kernel), 6, 64)
    fn = KernelFunction(get_op("rmsnorm_bwd"), lambda dtype, n: wrapped)
    fn._plan("float32", 16)  # no checked call yet: no workspace to bind, Python allocates
    assert not native_call.is_caller(fn._fast[(torch.float32, 16, 2)])
    wrapped.buffers["cpu"] = torch.empty(64)
    fn._plans.clear()
    fn._plan("float32", 16)
    dx, dw = fn(torch.randn(4, 16), torch.randn(4, 16), torch.randn(16), torch.rand(4))
    assert dx.shape == (4, 16) and dw.shape == (16,) and calls == [7]  # 4 inputs, 2 outputs, the workspace


def _doubling(calls: list[int]) -> object:
    """A stand-in softmax kernel at N = 16 that refuses what the compiled kernel's checks would."""

    def kernel(x: object, out: object) -> None:
        t = _torch(x)
        if t.dim() != 2 or t.shape[-1] != 16:
            raise ValueError("Mismatched Tensor on argument #0")
        calls.append(t.shape[0])
        _torch(out).copy_(t * 2)

    return tvm_ffi.convert(kernel)


def _python_calls(fn: object, *args: object, **kwargs: object) -> tuple[object, list[str]]:
    """fn(*args, **kwargs), and the Python functions of llmcompile that ran during the call."""
    ran: list[str] = []

    def profile(frame, event, arg) -> None:  # noqa: ANN001
        if event == "call" and "llmcompile" in frame.f_code.co_filename:
            ran.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        out = fn(*args, **kwargs)
    except OpError as e:  # (the checked path's word on a CPU tensor)
        out = e
    finally:
        sys.setprofile(None)
    return out, ran


def test_every_planned_shape_is_called_in_c_with_no_python() -> None:
    calls: list[int] = []
    fn = KernelFunction(get_op("softmax"), lambda dtype, n: _doubling(calls))
    fn._plan("float32", 16)
    fn._plan("float32", 8)  # (the stand-in refuses it: the checked path's word follows)
    assert fn._c_calls() == 2
    x = torch.randn(4, 16)
    out, ran = _python_calls(fn, x)
    assert torch.equal(out, x * 2) and ran == []
    out, ran = _python_calls(fn, x[:3])  # another M: the same plan
    assert torch.equal(out, x[:3] * 2) and ran == [] and calls == [4, 3]
    with pytest.raises(OpError, match="CUDA device"):  # refused in C, then the checked path
        fn(torch.randn(4, 8))
    out, ran = _python_calls(fn, x)  # a refusal changes nothing for the shapes that fit
    assert torch.equal(out, x * 2) and ran == [] and calls == [4, 3, 4]
    refused, ran = _python_calls(fn, x.double())  # a dtype not planned: the Python call
    assert isinstance(refused, OpError) and ran[0] == "__call__"
    fn._plans.clear()
    fn._plan("float32", 16)  # planned again: the same entry, replaced
    assert fn._c_calls() == 2
    # the class's __call__ stays a Python function: what torch.compile traces
    assert type(KernelFunction.__dict__["__call__"]).__name__ == "function"


def test_a_call_not_yet_planned_plans_its_shape_for_c() -> None:
    calls: list[int] = []
    fn = KernelFunction(get_op("softmax"), lambda dtype, n: _doubling(calls))
    assert fn._c_calls() == 0
    with pytest.raises(OpError, match="CUDA device"):  # the first call: the checked path (CPU here)
        fn(torch.randn(4, 16))
    assert fn._c_calls() == 0 and not calls  # nothing planned from a call that did not run


def test_inputs_that_require_grad_and_keywords_take_the_python_call() -> None:
    calls: list[int] = []
    fn = KernelFunction(get_op("softmax"), lambda dtype, n: _doubling(calls))
    fn._plan("float32", 16)
    grads: list[int] = []
    fn.grad_fn = lambda *ins, **kw: grads.append(len(ins)) or "differentiable"
    x = torch.randn(4, 16)
    w = x.clone().requires_grad_()
    assert fn(w) == "differentiable" and grads == [1]
    with torch.no_grad():
        out, ran = _python_calls(fn, w)  # no grad wanted: the C call
    assert torch.equal(out, x * 2) and ran == []
    fn.grad_fn = None
    out, ran = _python_calls(fn, w.detach())
    assert ran == [] and calls == [4, 4]
    with pytest.raises(OpError, match="takes no argument"):  # keywords: the checked path's word
        fn(x, beta=2.0)
    out, ran = _python_calls(fn, x)
    assert ran == [] and calls == [4, 4, 4]


def test_torch_compile_traces_the_python_call_into_the_op() -> None:
    """The C slot does not hide the call from dynamo: fullgraph tracing reaches the torch.library op."""
    fn = KernelFunction(get_op("softmax"), lambda dtype, n: _doubling([]), op_name="test_native_entry_softmax")
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, example: list) -> object:
        graphs.append(gm)
        return lambda *args: (torch.zeros(4, 16),)  # the op has a CUDA kernel only: the graph is not run

    torch.compile(lambda t: fn(t), backend=backend, fullgraph=True)(torch.randn(4, 16))
    (gm,) = graphs
    assert "torch.ops.llmcompile.test_native_entry_softmax" in gm.code


def test_an_installed_class_hands_what_c_does_not_take_to_its_own_python_call() -> None:
    class Other(native_call.entry_base()):  # (a second class beside KernelFunction)
        def __call__(self, *args: object, **kwargs: object) -> tuple:
            return ("python", args, kwargs)

    native_call.install(Other)
    many = tuple(range(20))  # past the C call's stack of arguments
    assert Other()(1, k=2) == ("python", (1,), {"k": 2})
    assert Other()(*many) == ("python", many, {})
    with pytest.raises(TypeError, match="define __call__ in Python"):
        native_call.install(type("NoCall", (native_call.entry_base(),), {}))


def test_rows_with_leading_dims_reach_the_kernel_as_one_m_and_come_back_in_their_shape() -> None:
    """An activation (batch, sequence, hidden) and its per-token values (batch, sequence): the
    kernel sees (M, N) and (M,) views of the same memory; x-like outputs come back (B, S, N), a
    value a row (B, S), a per-column one (N,)."""
    seen: list[tuple] = []

    def kernel(x: object, t: object, y: object, rows: object, cols: object) -> None:
        seen.append((tuple(x.shape), tuple(t.shape), tuple(y.shape), tuple(rows.shape), tuple(cols.shape)))
        xs = _torch(x)
        _torch(y).copy_(xs * 2)
        _torch(rows).copy_(xs.sum(-1) + _torch(t))
        _torch(cols).copy_(xs.sum(0))

    outs = [OutputSpec(0, "all", "float32"), OutputSpec(0, "first", "float32"), OutputSpec(0, "last", "float32")]
    call = native_call.make_caller(tvm_ffi.convert(kernel), 2, outs, flat=("rows", "values"))
    x, t = torch.randn(2, 3, 8), torch.randn(2, 3)
    y, rows, cols = call(x, t)
    assert seen == [((6, 8), (6,), (6, 8), (6,), (8,))]
    assert y.shape == (2, 3, 8) and rows.shape == (2, 3) and cols.shape == (8,)
    assert torch.equal(y, x * 2) and torch.allclose(rows, x.sum(-1) + t) and torch.allclose(cols, x.sum((0, 1)))
    y4, _, _ = call(torch.randn(2, 1, 3, 8), torch.randn(2, 1, 3))  # any number of leading dims
    assert y4.shape == (2, 1, 3, 8) and seen[-1][0] == (6, 8)
    # a slice along the batch dim is still one run of rows, and every other token rows a fixed
    # stride apart (the kernel's own checks say whether it takes that stride); a slice of the
    # tokens is not: its rows are not evenly spaced
    y, rows, _ = call(torch.randn(4, 3, 8)[1:3], torch.randn(2, 3))
    assert y.shape == (2, 3, 8) and seen[-1][0] == (6, 8)
    with pytest.raises(ValueError, match="rows that are not contiguous"):  # one flattens, to rows 16 apart
        call(torch.randn(2, 6, 8)[:, ::2], torch.randn(2, 3))
    with pytest.raises(ValueError, match="not one run of memory"):
        call(torch.randn(2, 4, 8)[:, :3], torch.randn(2, 3))
    with pytest.raises(ValueError, match="rows that are not contiguous"):  # a slice of wider rows
        call(torch.randn(6, 16)[:, :8], torch.randn(6))
    with pytest.raises(ValueError, match="rows that are not contiguous"):  # a value a row, broadcast
        call(torch.randn(6, 8), torch.randn(1).expand(6))
    with pytest.raises(ValueError, match="not one run of memory"):
        call(torch.randn(3, 2, 8).transpose(0, 1), torch.randn(2, 3))
    assert len(seen) == 3  # (refused before the kernel, as its own checks would)
    plain = native_call.make_caller(tvm_ffi.convert(kernel), 2, outs)  # no flat kinds: as they are
    seen.clear()
    with pytest.raises(Exception):  # noqa: B017, PT011 - (the stand-in's shapes do not fit 3-D views)
        plain(x, t)


def test_3d_rows_and_scalars_by_keyword_take_the_fast_call() -> None:
    """What every model passes: eps by keyword (its default or another value) and 3-D
    activations. Both take the plan's call (the C Caller), never the checked path."""
    k = _Kernel(n_in=2)
    fn = KernelFunction(get_op("rmsnorm"), lambda dtype, n: tvm_ffi.convert(k))
    fn._plan("float32", 16)
    x, w = torch.randn(2, 3, 16), torch.randn(16)
    out, ran = _python_calls(fn, x, w)
    assert ran == [] and out.shape == (2, 3, 16) and torch.allclose(out, x * 2 + 1e-6)
    ran_given: list[list[str]] = []
    for eps in (1e-6, 1e-5, 1e-5):
        sys.setprofile(None)
        ran: list[str] = []

        def profile(frame, event, arg, ran=ran) -> None:  # noqa: ANN001
            if event == "call" and "llmcompile" in frame.f_code.co_filename:
                ran.append(frame.f_code.co_name)

        sys.setprofile(profile)
        try:
            out = fn(x, w, eps=eps)
        finally:
            sys.setprofile(None)
        ran_given.append(ran)
        assert out.shape == (2, 3, 16) and torch.allclose(out, x * 2 + eps)
        assert k.calls[-1][-1] == pytest.approx(eps)
    assert all("_checked_call" not in r and "_rows_call" not in r for r in ran_given), ran_given
    assert "native_function" in ran_given[1] and "native_function" not in ran_given[2]  # made once, kept
    with pytest.raises(OpError, match="takes no argument"):
        fn(x, w, epsilon=1e-5)


def test_a_slice_is_copied_dense_and_takes_the_fast_call() -> None:
    """A slice of wider rows (or a broadcast input) is refused in C at no cost, then copied
    dense, as torch's row ops do, and called fast: not the checked path's validation."""
    calls: list[int] = []
    fn = KernelFunction(get_op("softmax"), lambda dtype, n: _doubling(calls))
    fn._plan("float32", 16)
    wide = torch.randn(4, 32)
    out, ran = _python_calls(fn, wide[:, :16])
    assert torch.equal(out, wide[:, :16] * 2) and calls == [4]
    assert "_dense_call" in ran and "prepare" not in ran
    out, ran = _python_calls(fn, wide[:, :16].contiguous())  # dense: C alone, as before
    assert ran == [] and calls == [4, 4]


def _strided_doubling(calls: list[tuple[int, int]]) -> object:
    """A stand-in softmax kernel at N = 16 compiled for strided rows: it reads x's rows at the row
    stride it is handed (recorded with the row count), as the strided compile's kernel does."""

    def kernel(x: object, out: object) -> None:
        (m, n), (s0, s1) = tuple(x.shape), tuple(x.strides)
        if n != 16 or s1 != 1:
            raise ValueError("Mismatched Tensor on argument #0")
        size = ((m - 1) * s0 + n) * 4
        buf = torch.frombuffer((ctypes.c_byte * size).from_address(x.data_ptr()), dtype=torch.float32)
        calls.append((m, s0))
        _torch(out).copy_(buf.as_strided((m, n), (s0, 1)) * 2)

    return tvm_ffi.convert(kernel)


def test_a_slice_of_wider_rows_goes_to_the_call_made_for_strided_rows() -> None:
    """set_strided: a slice whose rows are 16-byte aligned runs the second call, read where it
    lies (no copy); dense rows keep the first; a row stride that breaks alignment is refused."""
    dense_calls: list[int] = []
    strided_calls: list[tuple[int, int]] = []
    out = [OutputSpec(0, "all", "float32")]
    dense = native_call.make_caller(_doubling(dense_calls), 1, out, flat=("rows",))
    strided = native_call.make_caller(_strided_doubling(strided_calls), 1, out, flat=("rows",))
    wide = torch.randn(4, 32)
    with pytest.raises(ValueError, match="rows that are not contiguous"):  # none given yet
        dense(wide[:, :16])
    native_call.set_strided(dense, strided)
    y = dense(wide[:, :16])
    assert torch.equal(y, wide[:, :16] * 2) and y.is_contiguous() and strided_calls == [(4, 32)]
    y3 = dense(torch.randn(2, 3, 32)[..., :16])  # leading dims that flatten to strided rows
    assert y3.shape == (2, 3, 16) and strided_calls[-1] == (6, 32)
    assert torch.equal(dense(wide[:, 8:24].contiguous()), wide[:, 8:24] * 2) and dense_calls == [4]
    with pytest.raises(ValueError, match="rows that are not contiguous"):  # rows 72 bytes apart
        dense(torch.randn(4, 18)[:, :16])
    with pytest.raises(ValueError, match="rows that are not contiguous"):  # the first row off 16 bytes
        dense(torch.randn(4, 32)[:, 1:17])
    assert len(strided_calls) == 2
    with pytest.raises(ValueError, match="another"):
        native_call.set_strided(strided, strided)


def test_a_slice_takes_the_strided_kernel_then_starts_in_c() -> None:
    """KernelFunction: the first slice compiles the strided kernel (Python), and keeps its C call
    beside the dense one; the next slice runs with no Python at all."""
    dense_calls: list[int] = []
    strided_calls: list[tuple[int, int]] = []
    asked: list[tuple[str, int]] = []
    fn = KernelFunction(
        get_op("softmax"),
        lambda dtype, n: _doubling(dense_calls),
        compile_strided=lambda dtype, n: asked.append((dtype, n)) or _strided_doubling(strided_calls),
    )
    fn._plan("float32", 16)
    wide = torch.randn(4, 32)
    out, ran = _python_calls(fn, wide[:, :16])
    assert torch.equal(out, wide[:, :16] * 2) and "_strided_call" in ran and "_dense_call" not in ran
    out, ran = _python_calls(fn, wide[:, 16:])
    assert ran == [] and torch.equal(out, wide[:, 16:] * 2)
    assert asked == [("float32", 16)] and strided_calls == [(4, 32), (4, 32)] and dense_calls == []
    out, ran = _python_calls(fn, torch.randn(4, 18)[:, :16])  # not 16-byte aligned rows: copied dense
    assert "_dense_call" in ran and dense_calls == [4]


def test_a_strided_compile_that_fails_leaves_slices_to_the_dense_copy() -> None:
    """The strided kernel is a speed path: where its compile refuses (an op whose kernel takes no
    row stride), a slice is copied dense and called fast, as before, and the compile is not
    tried again."""
    dense_calls: list[int] = []
    tried: list[tuple[str, int]] = []

    def refuse(dtype: str, n: int) -> object:
        tried.append((dtype, n))
        raise ValueError("this kernel takes dense rows only")

    fn = KernelFunction(get_op("softmax"), lambda dtype, n: _doubling(dense_calls), compile_strided=refuse)
    fn._plan("float32", 16)
    wide = torch.randn(4, 32)
    for _ in range(2):
        out, ran = _python_calls(fn, wide[:, :16])
        assert torch.equal(out, wide[:, :16] * 2) and "_dense_call" in ran
    assert tried == [("float32", 16)] and dense_calls == [4, 4]


def test_an_input_of_another_dtype_is_refused_in_c_or_taken_by_the_alternate() -> None:
    """in_dtypes: a weight of another dtype than the call was made for never reaches its kernel
    (refused at no cost); with an alternate (the op made for that dtype) the alternate runs."""
    ours, theirs = _Kernel(n_in=2), _Kernel(n_in=2)
    out = [OutputSpec(0, "all", "float32")]
    first = native_call.make_caller(tvm_ffi.convert(ours), 2, out, in_dtypes=("float32", "float32"))
    other = native_call.make_caller(tvm_ffi.convert(theirs), 2, out, in_dtypes=("float32", "float64"))
    x, w, w64 = torch.randn(3, 8), torch.randn(8), torch.randn(8, dtype=torch.float64)
    assert torch.equal(first(x, w), x * 2) and len(ours.calls) == 1
    with pytest.raises(TypeError, match="dtype this kernel was not compiled for"):
        first(x, w64)
    with pytest.raises(TypeError, match="dtype this kernel was not compiled for"):
        first(x.double(), w)  # x's dtype is checked too
    assert len(ours.calls) == 1 and not theirs.calls
    native_call.set_alternate(first, other)
    assert torch.equal(first(x, w64), x * 2) and len(theirs.calls) == 1 and len(ours.calls) == 1
    assert torch.equal(first(x, w), x * 2) and len(ours.calls) == 2
    with pytest.raises(TypeError, match="dtype this kernel"):  # neither takes it: the last one says so
        first(x.double(), w64)
    with pytest.raises(ValueError, match="leads back"):
        native_call.set_alternate(other, first)


def _fp32_weight_calls(plan_ours: bool) -> tuple:
    """rmsnorm with stand-in kernels (ours, and theirs for fp32 weights: vectors32), ours planned or
    not, after two calls with an fp32 weight: the first through Python, which hands it to theirs;
    the second all in C. (fn, ours, theirs, x, w)"""
    from llmcompile.runtime.compiled import vectors_in_fp32

    ours, theirs = _Kernel(n_in=2), _Kernel(n_in=2)
    spec = get_op("rmsnorm")
    fn = KernelFunction(spec, lambda dtype, n: tvm_ffi.convert(ours))
    fn.vectors32 = KernelFunction(vectors_in_fp32(spec), lambda dtype, n: tvm_ffi.convert(theirs))
    if plan_ours:
        fn._plan("bfloat16", 16)
    fn.vectors32._plan("bfloat16", 16)
    x, w = torch.randn(2, 3, 16, dtype=torch.bfloat16), torch.rand(16) + 0.5
    out, ran = _python_calls(fn, x, w)
    assert "_vectors32_call" in ran and torch.equal(out, x * 2 + 1e-6) and len(theirs.calls) == 1
    out, ran = _python_calls(fn, x, w)
    assert ran == [] and len(theirs.calls) == 2 and not ours.calls
    return fn, ours, theirs, x, w


def test_fp32_weights_beside_16bit_rows_take_the_fp32_weight_kernel_then_start_in_c() -> None:
    """KernelFunction.vectors32: the first call with fp32 weights (eps by keyword or not) goes to
    the op compiled for fp32 (N,) tensors and makes its C call our alternate; the next runs with
    no Python at all. bf16 weights keep our own kernel."""
    from llmcompile.runtime.compiled import vectors_in_fp32

    fn, ours, theirs, x, w = _fp32_weight_calls(plan_ours=True)
    out, ran = _python_calls(fn, x, w.bfloat16())
    assert ran == [] and len(ours.calls) == 1
    out, ran = _python_calls(fn, x, w, eps=1e-5)  # a keyword: its own fast call, its own alternate
    assert "_vectors32_call" in ran and theirs.calls[-1][-1] == pytest.approx(1e-5)
    out, ran = _python_calls(fn, x, w, eps=1e-5)
    assert "_checked_call" not in ran and len(theirs.calls) == 4
    # a slice with an fp32 weight: our call hands it to theirs, which takes its own strided kernel
    strided_calls: list[tuple[int, int]] = []

    def strided_norm(dtype: str, n: int) -> object:
        def kernel(x: object, w: object, out: object, eps: float) -> None:
            (m, _), (s0, _) = tuple(x.shape), tuple(x.strides)
            strided_calls.append((m, s0))

        return tvm_ffi.convert(kernel)

    fn.vectors32.strided_compiler = strided_norm
    wide = torch.randn(6, 32, dtype=torch.bfloat16)
    fn(wide[:, :16], w)
    out, ran = _python_calls(fn, wide[:, :16], w)
    assert ran == [] and strided_calls == [(6, 32), (6, 32)]
    assert vectors_in_fp32(get_op("softmax")) is None
    assert [t.dtype for t in vectors_in_fp32(get_op("layernorm_bwd")).tensors if t.dims == ("N",)] == ["float32"] * 3


def test_fp32_weights_alone_start_in_c_before_our_kernel_is_planned() -> None:
    """Where every call so far had fp32 weights (mixed-precision training), our kernel is not planned
    for those rows: the first call registers the fp32 kernel's C call as ours, so the next starts
    and ends in C, and `fast_call` (what an autograd node keeps for eps by keyword) is its fast
    call. Once ours is planned it takes its own rows back, and fp32 weights its alternate."""

    fn, ours, theirs, x, w = _fp32_weight_calls(plan_ours=False)
    given = fn.fast_call(x, eps=1e-5)
    assert native_call.is_caller(given) and given is fn.vectors32.fast_call(x, eps=1e-5)
    fn._plan("bfloat16", 16)  # (what a first call with a bf16 weight does on the GPU)
    assert fn.fast_call(x) is fn._fast[(torch.bfloat16, 16, 3)]
    out, ran = _python_calls(fn, x, w.bfloat16())
    assert ran == [] and len(ours.calls) == 1
    out, ran = _python_calls(fn, x, w)  # our C call refuses it; the checked path makes theirs its alternate
    assert "_vectors32_call" in ran and len(theirs.calls) == 3
    out, ran = _python_calls(fn, x, w)
    assert ran == [] and len(theirs.calls) == 4 and len(ours.calls) == 1


def test_with_several_gpus_calls_start_in_c_which_checks_the_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a host of several GPUs the C call is planned as on one: it refuses tensors on two devices
    itself (tests/test_callpath.py runs that on two GPUs). A multi-GPU H200 host had run every call
    through Python, 2.3x torch's host time a call (evals/results/host-time)."""
    k = _Kernel(n_in=2)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    fn = KernelFunction(get_op("rmsnorm"), lambda dtype, n: tvm_ffi.convert(k))
    fn._plan("float32", 16)
    assert native_call.is_caller(fn._fast[(torch.float32, 16, 2)])
    x, w = torch.randn(4, 16), torch.randn(16)
    out, ran = _python_calls(fn, x, w)
    assert ran == [] and len(k.calls) == 1 and torch.allclose(out, x * 2 + 1e-6)
    out, ran = _python_calls(fn, x, w, eps=1e-5)  # (a keyword call's C call is made once, then kept)
    assert len(k.calls) == 2 and torch.allclose(out, x * 2 + 1e-5) and fn._fast_given


def test_with_several_gpus_and_no_c_call_python_checks_each_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the C call the Python fast call is planned on one GPU only (it checks no device): on
    several, every call takes the Python checks, a keyword call too."""
    k = _Kernel(n_in=2)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(native_call, "available", lambda: False)
    fn = KernelFunction(get_op("rmsnorm"), lambda dtype, n: tvm_ffi.convert(k))
    fn._plan("float32", 16)
    assert (torch.float32, 16, 2) not in fn._fast
    with pytest.raises(OpError, match="CUDA device"):  # the checked path's word on a CPU tensor
        fn(torch.randn(4, 16), torch.randn(16), eps=1e-5)
    assert not k.calls and not fn._fast_given
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    fn._plan("float32", 16)
    assert (torch.float32, 16, 2) in fn._fast and not native_call.is_caller(fn._fast[(torch.float32, 16, 2)])
