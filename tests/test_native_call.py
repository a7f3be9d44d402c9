"""CPU (CI): the call whose outputs are made in C, built here with the machine's C compiler and
driven through TVM-FFI on CPU tensors (torch's allocator serves them as it serves CUDA ones)."""

from __future__ import annotations

import pytest
import torch

from llmcompile import native_call
from llmcompile.callpath import KernelFunction
from llmcompile.native_call import OutputSpec
from llmcompile.ops import OpError, get_op

tvm_ffi = pytest.importorskip("tvm_ffi")


@pytest.fixture(autouse=True)
def _built() -> None:
    if not native_call.available():
        pytest.fail(f"native_call did not build on this machine: {native_call.reason()}")


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
        x = torch.from_dlpack(args[0])
        outs = [torch.from_dlpack(a) for a in args if isinstance(a, tvm_ffi.Tensor)][self.n_in :]
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


def test_calls_it_cannot_take_are_refused_before_any_allocation() -> None:
    k = _Kernel()
    call = native_call.make_caller(tvm_ffi.convert(k), 1, [OutputSpec(0, "all", "float32")])
    with pytest.raises(TypeError, match="number of inputs"):
        call(torch.randn(2, 4), torch.randn(2, 4))
    with pytest.raises(TypeError, match="must be a tensor"):
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
    assert isinstance(fn._fast[(torch.float32, 16, 2)], tvm_ffi.Function)
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


def test_one_shape_so_far_skips_the_lookup_and_a_second_ends_that_for_good() -> None:
    """While one (dtype, N) has been called, a call goes straight to its C function (no key
    built); the first call that function refuses turns that off, and the call still lands."""
    calls: list[int] = []

    def kernel(x: object, out: object) -> None:  # refuses what the compiled kernel's C checks would
        t = torch.from_dlpack(x)
        if t.dim() != 2 or t.shape[-1] != 16:
            raise ValueError("Mismatched Tensor on argument #0")
        calls.append(t.shape[0])
        torch.from_dlpack(out).copy_(t * 2)

    fn = KernelFunction(get_op("softmax"), lambda dtype, n: tvm_ffi.convert(kernel))
    fn._plan("float32", 16)
    x = torch.randn(4, 16)
    assert torch.equal(fn(x), x * 2) and fn._only is fn._fast[(torch.float32, 16, 2)]
    assert torch.equal(fn(x[:3]), x[:3] * 2) and calls == [4, 3] and fn._only is not None
    with pytest.raises(OpError, match="CUDA device"):  # N = 8: refused in C, then the checked path
        fn(torch.randn(4, 8))
    assert fn._only is None and not fn._single
    assert torch.equal(fn(x), x * 2) and calls == [4, 3, 4] and fn._only is None  # the keyed call


def test_python_stand_ins_keep_the_python_allocation() -> None:
    fn = KernelFunction(get_op("softmax"), lambda dtype, n: _Kernel())
    fn._plan("float32", 16)
    assert not isinstance(fn._fast[(torch.float32, 16, 2)], tvm_ffi.Function)


def test_the_library_is_built_once_into_the_cache(tmp_path) -> None:  # noqa: ANN001
    path = tmp_path / "nc.so"
    native_call.build(path)
    assert path.is_file() and not [p for p in tmp_path.iterdir() if p != path]  # no temporary left
    mod = tvm_ffi.load_module(str(path))
    assert mod.get_function("llmcompile_make_caller") is not None


def test_a_bound_workspace_follows_the_outputs_and_per_column_outputs_take_n() -> None:
    seen: list[tuple] = []

    def kernel(x: object, colsum: object, ws: object, scale: float) -> None:
        seen.append((x, colsum, ws, scale))
        torch.from_dlpack(colsum).copy_(torch.from_dlpack(x).sum(0) * scale)

    ws = torch.zeros(32)
    call = native_call.make_caller(tvm_ffi.convert(kernel), 1, [OutputSpec(0, "last", "float32")], (3.0,), (ws,))
    x = torch.randn(5, 8)
    ws_ptr = ws.data_ptr()
    del ws  # the caller holds it
    out = call(x)
    assert out.shape == (8,) and torch.allclose(out, x.sum(0) * 3)
    ((_, _, got_ws, scale),) = seen
    assert torch.from_dlpack(got_ws).data_ptr() == ws_ptr and scale == 3.0


def test_a_kernel_with_a_workspace_binds_the_one_its_checked_call_made() -> None:
    from llmcompile.contract import WithWorkspace

    calls: list[int] = []

    def kernel(*args: object) -> None:
        calls.append(len(args))

    wrapped = WithWorkspace(tvm_ffi.convert(kernel), 6, 64)
    fn = KernelFunction(get_op("rmsnorm_bwd"), lambda dtype, n: wrapped)
    fn._plan("float32", 16)  # no checked call yet: no workspace to bind, Python allocates
    assert not isinstance(fn._fast[(torch.float32, 16, 2)], tvm_ffi.Function)
    wrapped.buffers["cpu"] = torch.empty(64)
    fn._plans.clear()
    fn._plan("float32", 16)
    dx, dw = fn(torch.randn(4, 16), torch.randn(4, 16), torch.randn(16), torch.rand(4))
    assert dx.shape == (4, 16) and dw.shape == (16,) and calls == [7]  # 4 inputs, 2 outputs, the workspace
