"""CPU (CI): the row ops' C++ autograd nodes (runtime/autograd_native.py), built here with the
machine's C++ compiler against this torch, driven with stand-in kernel functions on CPU tensors
(the real ones run on the GPU: tests/test_autograd.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
import torch.nn.functional as F

from llmcompile.runtime import autograd, autograd_native
from llmcompile.specs import BUILTIN, OpError
from llmcompile.specs import references as ops


@pytest.fixture
def ext(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """The extension with stand-in kernel functions (float64 references on the CPU, which record
    their calls); the real kernel functions registered again afterwards."""
    monkeypatch.setattr(autograd, "NATIVE_NODES", True)  # (the default, unless LLMCOMPILE_NATIVE_AUTOGRAD=0)
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

    class Forward:
        """A norm's forward kernel function: its fast call with eps bound (`fast_call`) exists once a
        call with that eps by keyword planned it, and refuses one row, as a fast call refuses what
        does not fit (ValueError), for the keyword call to take."""

        def __init__(self, name: str, fn: object) -> None:
            self.name, self.fn, self.planned = name, fn, set()

        def __call__(self, *args: torch.Tensor, **kw: float) -> object:
            assert not torch.is_grad_enabled()
            calls.append((self.name, kw))
            self.planned.add(tuple(kw.items()))
            return self.fn(*args, **kw)

        def fast_call(self, x: torch.Tensor, **kw: float) -> object:
            if tuple(kw.items()) not in self.planned:
                return None

            def fast(*args: torch.Tensor) -> object:
                if args[0].shape[0] == 1:
                    raise ValueError("refused")
                calls.append((f"{self.name} fast", kw))
                return self.fn(*args, **kw)

            return fast

    def softmax_bwd(dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        assert dy.is_contiguous() and dy.dtype == y.dtype  # (an expanded gradient is made dense first)
        return y * (dy - (dy * y).sum(-1, keepdim=True))

    def log_softmax_bwd(dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return dy - y.exp() * dy.sum(-1, keepdim=True)

    # .sum()'s gradient reaches these as its one value, (1,), never made dense
    def softmax_bwd_scalar(y: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        assert c.shape == (1,) and c.dtype == y.dtype
        return softmax_bwd(c.expand(y.shape).contiguous(), y)

    def log_softmax_bwd_scalar(y: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        assert c.shape == (1,) and c.dtype == y.dtype
        return log_softmax_bwd(c.expand(y.shape), y)

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

    m.register_op(
        m.SOFTMAX,
        rec("softmax", lambda x: torch.softmax(x, -1)),
        rec("softmax_bwd", softmax_bwd),
        rec("softmax_bwd_scalar", softmax_bwd_scalar),
    )
    m.register_op(
        m.LOG_SOFTMAX,
        rec("log_softmax", lambda x: torch.log_softmax(x, -1)),
        rec("log_softmax_bwd", log_softmax_bwd),
        rec("log_softmax_bwd_scalar", log_softmax_bwd_scalar),
    )
    fwd_defaults = ({"eps": 1e-6}, {"eps": 1e-5})
    rms = rows(lambda x, w, eps=fwd_defaults[0]["eps"]: ops.ref_rmsnorm_fwd(x, w, eps), 1)
    ln = rows(lambda x, w, b, eps=fwd_defaults[1]["eps"]: ops.ref_layernorm_fwd(x, w, b, eps), 1)

    def one(ref: object) -> object:  # (c is x's dtype, shape (1,): the one value of .sum()'s gradient)
        def call(x: torch.Tensor, c: torch.Tensor, *rest: torch.Tensor) -> list[torch.Tensor]:
            assert c.shape == (1,) and c.dtype == x.dtype
            return rows(ref, 1)(x, c, *rest)

        return call

    for op, fwd, name, bwd, bwd_one in (
        (m.RMSNORM, rms, "rmsnorm", ops.ref_rmsnorm_bwd, BUILTIN["rmsnorm_bwd_scalar"].reference),
        (m.LAYERNORM, ln, "layernorm", ops.ref_layernorm_bwd, BUILTIN["layernorm_bwd_scalar"].reference),
    ):
        m.register_op(
            op,
            Forward(f"{name}_fwd", fwd),
            rec(f"{name}_bwd", rows(bwd, 1)),
            rec(f"{name}_bwd_scalar", one(bwd_one)),
            eps=BUILTIN[name].scalars["eps"],  # (a call's default, and the forward kernel's own)
            kernel_eps=BUILTIN[f"{name}_fwd"].scalars["eps"],
        )
    m.calls = calls
    try:
        yield m
    finally:
        autograd_native.register_kernels(m)


@pytest.mark.parametrize("log", [False, True])
def test_softmax_nodes_give_torchs_gradients(ext: object, log: bool) -> None:
    """A C++ node, not a Python Function: its gradient is torch's, for a dense upstream gradient and
    for .sum()'s expanded one (read as its one value), through leading dims; an
    upstream gradient expanded along the rows alone is made dense."""
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
    (ga,) = torch.autograd.grad(y.sum(), a, retain_graph=True)
    (gb,) = torch.autograd.grad(want.sum(), b, retain_graph=True)
    torch.testing.assert_close(ga, gb)
    (ga,) = torch.autograd.grad(y.sum() * 3.0, a, retain_graph=True)  # (one value, not 1)
    (gb,) = torch.autograd.grad(want.sum() * 3.0, b, retain_graph=True)
    torch.testing.assert_close(ga, gb)
    per_row = torch.randn(2, 3, dtype=torch.float64)  # (expanded along each row only: strides (3, 1, 0))
    (ga,) = torch.autograd.grad(y.sum(-1), a, per_row)
    (gb,) = torch.autograd.grad(want.sum(-1), b, per_row)
    torch.testing.assert_close(ga, gb)
    name = "log_softmax" if log else "softmax"
    assert [c for c, _ in ext.calls] == [name, f"{name}_bwd", *[f"{name}_bwd_scalar"] * 2, f"{name}_bwd"]


@pytest.mark.parametrize("eps", [None, 1e-5])
def test_norm_nodes_give_torchs_gradients(ext: object, eps: float | None) -> None:
    """RMSNorm and LayerNorm nodes: out, dx, dw (and db) against torch's autograd in float64, for a
    dense upstream gradient and for .sum()'s (read as its one value); eps reaches the forward kernel
    by keyword only where it is not the kernel's default, and from the second call of a shape, bound
    in the kernel function's fast call (a refused fast call goes to the keyword call)."""
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
        for g, r in zip(
            torch.autograd.grad(out, mine, dy, retain_graph=True), torch.autograd.grad(want, ref, dy, retain_graph=True)
        ):
            torch.testing.assert_close(g, r)
        for g, r in zip(torch.autograd.grad(out.sum() * 3.0, mine), torch.autograd.grad(want.sum() * 3.0, ref)):
            torch.testing.assert_close(g, r)
        (fwd_name, fwd_kw), (bwd_name, _), (one_name, _) = ext.calls
        assert fwd_name.endswith("_fwd") and bwd_name.endswith("_bwd") and one_name.endswith("_bwd_scalar")
        assert fwd_kw == ({} if eps in (None, default) else {"eps": eps}), (fwd_name, fwd_kw)
        # a non-contiguous x is saved dense, as the kernels read it
        xt = x.transpose(0, 1).contiguous().transpose(0, 1).requires_grad_()
        torch.testing.assert_close(ours(xt, *params, **kw), theirs(x, *params))
        given = eps not in (None, default)
        assert ext.calls[-1][0] == fwd_name + (" fast" if given else "")
        torch.testing.assert_close(ours(x[:, :1], *params, **kw), theirs(x[:, :1], *params))
        torch.testing.assert_close(ours(x[:1], *params, **kw), theirs(x[:1], *params))  # (refused by the fast call)
        assert [c for c, _ in ext.calls[-2:]] == [fwd_name + (" fast" if given else ""), fwd_name]


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
    monkeypatch.setattr(autograd, "NATIVE_NODES", False)  # LLMCOMPILE_NATIVE_AUTOGRAD=0: the Python Functions
    assert autograd._nodes(torch.randn(3)) is None


@pytest.fixture
def routed(ext: object, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple]]:
    """The public kernel functions routed to the nodes (`autograd._native`), each with a recording
    `grad_fn`: a call that reaches it went through the Python call, not straight to its node."""
    from llmcompile import kernels

    assert autograd._native() is ext
    python_calls: list[tuple] = []
    for name in ("softmax", "log_softmax", "rmsnorm", "layernorm"):
        fn = getattr(kernels, name)
        monkeypatch.setattr(fn, "grad_fn", lambda *a, _name=name, **kw: python_calls.append((_name, kw)) or a[0])
    yield python_calls


def test_a_call_that_wants_grad_goes_from_c_straight_to_its_node(ext: object, routed: list[tuple]) -> None:
    """kernels.softmax(x) / rmsnorm(x, w, eps=...) with x requiring grad: from the kernel function's C
    call to the C++ node (grad_call), not its Python __call__ and autograd.py's wrappers; eps by
    keyword, by position or not given (the op's default) reaches the forward kernel as before; the
    gradients are torch's."""
    from llmcompile import kernels

    x = torch.randn(2, 3, 40, dtype=torch.float64)
    w = torch.rand(40, dtype=torch.float64) + 0.5
    dy = torch.randn(2, 3, 40, dtype=torch.float64)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    y = kernels.log_softmax(a)
    assert "Node" in y.grad_fn.name(), y.grad_fn.name()
    torch.testing.assert_close(y, torch.log_softmax(b, -1))
    (ga,) = torch.autograd.grad(y, a, dy)
    (gb,) = torch.autograd.grad(torch.log_softmax(b, -1), b, dy)
    torch.testing.assert_close(ga, gb)
    for args, kw, eps in (((), {}, 1e-6), ((), {"eps": 1e-5}, 1e-5), ((1e-5,), {}, 1e-5), ((), {"eps": 1e-6}, 1e-6)):
        ext.calls.clear()
        mine, ref = (x.clone().requires_grad_(), w.clone().requires_grad_()), (x.clone().requires_grad_(), w.clone())
        out = kernels.rmsnorm(*mine, *args, **kw)
        want = F.rms_norm(ref[0], (40,), ref[1].requires_grad_(), eps)
        torch.testing.assert_close(out, want)
        for g, r in zip(torch.autograd.grad(out, mine, dy), torch.autograd.grad(want, ref, dy)):
            torch.testing.assert_close(g, r)
        # the forward kernel's own default (1e-6) is not passed; another eps is
        (name, given), _ = ext.calls
        assert name in ("rmsnorm_fwd", "rmsnorm_fwd fast") and given == ({} if eps == 1e-6 else {"eps": eps}), ext.calls
    # w alone requiring grad takes the node too; x's gradient is then not asked for
    out = kernels.layernorm(x, w.clone().requires_grad_(), torch.zeros(40, dtype=torch.float64), eps=1e-5)
    assert "Node" in out.grad_fn.name()
    assert routed == []


def test_what_grad_call_does_not_take_goes_to_the_python_call(
    ext: object, routed: list[tuple], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Arguments grad_call does not parse (an unknown keyword, a keyword to softmax, a non-number
    eps, too many arguments), functorch transforms and torch.compile's tracing flag each send the
    call to the Python call, which says what is wrong or takes the Python Functions."""
    from llmcompile import kernels

    x = torch.randn(4, 40, dtype=torch.float64, requires_grad=True)
    w = torch.rand(40, dtype=torch.float64)
    kernels.rmsnorm(x, w, foo=1.0)
    kernels.softmax(x, eps=1.0)
    kernels.rmsnorm(x, w, eps="1e-5")
    kernels.rmsnorm(x, w, 1e-5, 1e-5)
    kernels.rmsnorm(x, w, 1e-5, eps=1e-5)
    torch.func.grad(lambda t: kernels.softmax(t).sum())(torch.randn(3, 40, dtype=torch.float64))
    monkeypatch.setattr(torch.compiler, "_is_compiling_flag", True)
    kernels.log_softmax(x)
    assert [name for name, _ in routed] == [
        "rmsnorm",
        "softmax",
        "rmsnorm",
        "rmsnorm",
        "rmsnorm",
        "softmax",
        "log_softmax",
    ]
    monkeypatch.setattr(torch.compiler, "_is_compiling_flag", False)
    routed.clear()
    kernels.log_softmax(x)
    assert routed == []


def test_a_kernel_functions_error_comes_through_grad_call_as_raised(ext: object, routed: list[tuple]) -> None:
    """An error the forward kernel function raises (what it refuses: a shape, a dtype) reaches the
    caller through the C++ node as the same exception, not a RuntimeError of the node's."""
    from llmcompile import kernels

    def refuse(x: torch.Tensor) -> torch.Tensor:
        raise ValueError("softmax: this x is refused")

    ext.register_op(ext.SOFTMAX, refuse, refuse, None)
    with pytest.raises(ValueError, match="this x is refused"):
        kernels.softmax(torch.randn(3, 8, dtype=torch.float64, requires_grad=True))
    assert routed == []


def test_forward_mode_ad_is_refused_not_dropped(ext: object) -> None:
    """The nodes carry no forward-mode AD: a dual input is refused with that said, never run with
    its tangent silently dropped."""
    import torch.autograd.forward_ad as fwad

    x = torch.randn(2, 8, dtype=torch.float64)
    with fwad.dual_level():
        dual = fwad.make_dual(x, torch.randn_like(x))
        with pytest.raises(RuntimeError, match="forward-mode AD"):
            autograd.softmax(dual)
        with pytest.raises(RuntimeError, match="forward-mode AD"):
            autograd.rmsnorm(dual, torch.rand(8, dtype=torch.float64))


def test_the_nodes_keep_autogrades_rules_on_saved_tensors(ext: object) -> None:
    """As torch's own nodes: a second backward through a freed graph is refused, a kept graph
    (retain_graph) gives the same gradient twice, and a saved output changed in place since the
    forward is refused at the backward, not read."""
    x = torch.randn(3, 16, dtype=torch.float64, requires_grad=True)
    w = (torch.rand(16, dtype=torch.float64) + 0.5).requires_grad_()
    for make in (lambda: autograd.softmax(x), lambda: autograd.rmsnorm(x, w)):
        out = make()
        first = torch.autograd.grad(out.sum() * 2.0, x, retain_graph=True)
        again = torch.autograd.grad(out.sum() * 2.0, x)
        torch.testing.assert_close(first, again)
        with pytest.raises(RuntimeError, match="second time"):
            torch.autograd.grad(out.sum(), x)
    y = autograd.softmax(x)
    y.mul_(2.0)  # (the output the backward reads)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(y.sum(), x)


def _by_address(t: object) -> torch.Tensor:
    """A CPU torch tensor over the memory of a DLTensor view a Caller handed its kernel."""
    import ctypes

    dtype = getattr(torch, str(t.dtype))
    buf = (ctypes.c_byte * (t.numel() * dtype.itemsize)).from_address(t.data_ptr())
    return torch.frombuffer(buf, dtype=dtype).view(tuple(t.shape))


def _strided_by_address(t: object) -> torch.Tensor:
    """A CPU torch tensor over the memory of a DLTensor view at its own strides."""
    import ctypes

    dtype = getattr(torch, str(t.dtype))
    extent = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.strides))
    buf = (ctypes.c_byte * (extent * dtype.itemsize)).from_address(t.data_ptr())
    return torch.frombuffer(buf, dtype=dtype).as_strided(tuple(t.shape), tuple(t.strides))


def _attention_caller(record: Callable[[object, object, float], object], strided: bool = False) -> object:
    """A call in C (`native_call`) of a TVM-FFI stand-in for a compiled attention kernel (q, k, v, o,
    lse, scale; v and o at any strides, of (b·h, s, d) or (b, h, s, d)): float64 SDPA on the CPU;
    `record(v, o, scale)` sees each run. `strided`: the strided-v call, which takes o (the caller's)
    with q, k and v and makes lse; else o and lse are made."""
    from llmcompile.runtime import native_call
    from llmcompile.runtime.native_call import OutputSpec
    from llmcompile.specs.attention import ref_attention

    tvm_ffi = pytest.importorskip("tvm_ffi")

    def kernel(q: object, k: object, v: object, o: object, lse: object, scale: float) -> None:
        record(v, o, scale)
        rows = _strided_by_address(v)
        out, s = ref_attention(True)(_by_address(q), _by_address(k), rows.reshape(-1, *rows.shape[-2:]), scale)
        _strided_by_address(o).copy_(out.view(tuple(o.shape)))
        _by_address(lse).copy_(s)

    n_in = 4 if strided else 3
    outs = (
        [OutputSpec(0, "lead", "float64")]
        if strided
        else [OutputSpec(0, "all", "float64"), OutputSpec(0, "lead", "float64")]
    )
    return native_call.make_caller(
        tvm_ffi.convert(kernel), n_in, outs, (0.5,), (), ("none",) * n_in, ("float64",) * n_in
    )


def _softmax_bwd_kernel(threads: list[int], fail: bool = False) -> object:
    """A TVM-FFI function standing in for the compiled softmax backward (dy, y, dx); TVM-FFI takes
    the GIL for a Python function itself. It records the thread it ran in."""
    import threading

    tvm_ffi = pytest.importorskip("tvm_ffi")

    def kernel(dy: object, y: object, dx: object) -> None:
        threads.append(threading.get_ident())
        if fail:
            raise RuntimeError("the backward kernel failed")
        g, s = _by_address(dy), _by_address(y)
        _by_address(dx).copy_(s * (g - (g * s).sum(-1, keepdim=True)))

    return tvm_ffi.convert(kernel)


def test_a_backward_launches_its_planned_kernel_without_the_gil(ext: object) -> None:
    """A backward whose kernel function has x's rows planned runs that Caller from C++ without the
    GIL (`backward_runs`' first count), through leading dims; one whose backward is not a kernel
    function (a stand-in here) calls it through Python (the second count). Both give torch's
    gradient."""
    from llmcompile.runtime import native_call
    from llmcompile.runtime.callpath import KernelFunction
    from llmcompile.specs import get_op

    threads: list[int] = []
    bwd = KernelFunction(get_op("softmax_bwd"), lambda dtype, n: _softmax_bwd_kernel(threads))
    bwd._plan("float32", 16)
    assert native_call.is_caller(bwd._fast[(torch.float32, 16, 2)])
    ext.register_op(ext.SOFTMAX, lambda x: torch.softmax(x, -1), bwd)
    x = torch.randn(2, 3, 16, requires_grad=True)
    dy = torch.randn(2, 3, 16)
    free, python = ext.backward_runs()
    (got,) = torch.autograd.grad((ext.softmax(x, ext.SOFTMAX) * dy).sum(), x)
    (want,) = torch.autograd.grad((torch.softmax(x, -1) * dy).sum(), x)
    torch.testing.assert_close(got, want)
    assert ext.backward_runs() == (free + 1, python) and len(threads) == 1
    y = ext.softmax(x, ext.LOG_SOFTMAX)  # (the fixture's stand-in backward: a Python function)
    torch.autograd.grad((y * dy).sum(), x)
    assert ext.backward_runs() == (free + 1, python + 1)


def test_a_failed_backward_kernel_raises_its_error(ext: object) -> None:
    """A kernel call that fails in the GIL-free launch raises the kernel's error at the backward,
    not a gradient of whatever the output held."""
    from llmcompile.runtime.callpath import KernelFunction
    from llmcompile.specs import get_op

    bwd = KernelFunction(get_op("softmax_bwd"), lambda dtype, n: _softmax_bwd_kernel([], fail=True))
    bwd._plan("float32", 16)
    ext.register_op(ext.SOFTMAX, lambda x: torch.softmax(x, -1), bwd)
    x = torch.randn(4, 16, requires_grad=True)
    with pytest.raises(RuntimeError, match="the backward kernel failed"):
        torch.autograd.grad((ext.softmax(x, ext.SOFTMAX) * torch.randn(4, 16)).sum(), x)


def _row_kernel(ref: object, n_in: int) -> object:
    """A TVM-FFI function standing in for a compiled row kernel: `n_in` input views, then the
    outputs, then the scalars; it writes ref(inputs, scalars)'s tensors into the outputs."""
    tvm_ffi = pytest.importorskip("tvm_ffi")

    def kernel(*args: object) -> None:
        tensors = [_by_address(a) for a in args if isinstance(a, tvm_ffi.Tensor)]
        scalars = [a for a in args if not isinstance(a, tvm_ffi.Tensor)]
        outs = ref(*tensors[:n_in], *scalars)
        for dst, src in zip(tensors[n_in:], outs if isinstance(outs, list) else [outs]):
            dst.copy_(src)

    return tvm_ffi.convert(kernel)


def test_a_forward_with_grad_launches_its_planned_kernel_from_cpp(ext: object) -> None:
    """A forward with grad whose kernel function has x's rows planned runs that Caller from C++
    (`forward_runs`' first count; its output an at::empty tensor, not a DLPack import), through
    leading dims; a forward that is not a kernel function (the fixture's stand-in) is called
    through Python (the second count). Both give torch's values and gradients."""
    from llmcompile.runtime.callpath import KernelFunction
    from llmcompile.specs import get_op

    fwd = KernelFunction(get_op("softmax"), lambda dtype, n: _row_kernel(lambda x: torch.softmax(x, -1), 1))
    fwd._plan("float32", 16)
    ext.register_op(ext.SOFTMAX, fwd, lambda dy, y: y * (dy - (dy * y).sum(-1, keepdim=True)))
    x, dy = torch.randn(2, 3, 16, requires_grad=True), torch.randn(2, 3, 16)
    for op, route in ((ext.SOFTMAX, 0), (ext.LOG_SOFTMAX, 1)):
        runs = ext.forward_runs()
        y = ext.softmax(x, op)
        done = ext.forward_runs()
        assert (done[0] - runs[0], done[1] - runs[1]) == ((1, 0) if route == 0 else (0, 1))
        ref = torch.softmax if op == ext.SOFTMAX else torch.log_softmax
        torch.testing.assert_close(y, ref(x, -1))
        (got,) = torch.autograd.grad((y * dy).sum(), x)
        (want,) = torch.autograd.grad((ref(x, -1) * dy).sum(), x)
        torch.testing.assert_close(got, want)


def test_a_norm_forward_with_eps_runs_its_fast_call_from_cpp(ext: object) -> None:
    """A norm's forward with grad runs from C++ the fast call with the call's eps bound where it is
    not the kernel's own (made once from the plan, then kept), and the planned Caller where it is:
    the kernel sees each eps. A forward whose fast call is a Python function (the fixture's) is
    called through Python."""
    from llmcompile.runtime.callpath import KernelFunction
    from llmcompile.specs import get_op

    seen: list[float] = []

    def ref(x: torch.Tensor, w: torch.Tensor, eps: float) -> list[torch.Tensor]:
        seen.append(eps)
        return ops.ref_rmsnorm_fwd(x, w, eps)

    x, w = torch.randn(4, 16, requires_grad=True), torch.rand(16) + 0.5
    runs = ext.forward_runs()
    ext.rmsnorm(x, w, 0.5)  # (the fixture's forward: Python)
    assert ext.forward_runs() == (runs[0], runs[1] + 1)
    fwd = KernelFunction(get_op("rmsnorm_fwd"), lambda dtype, n: _row_kernel(ref, 2))
    fwd._plan("float32", 16)
    own = BUILTIN["rmsnorm_fwd"].scalars["eps"]
    ext.register_op(ext.RMSNORM, fwd, lambda *a: ops.ref_rmsnorm_bwd(*a), eps=own, kernel_eps=own)
    for eps in (0.5, 0.5, own):
        runs = ext.forward_runs()
        out = ext.rmsnorm(x, w, eps)
        assert ext.forward_runs() == (runs[0] + 1, runs[1])
        assert seen[-1] == pytest.approx(eps)
        torch.testing.assert_close(out, F.rms_norm(x, (16,), w, eps))


def test_the_attention_node_asks_its_route_once_a_layout(ext: object) -> None:
    """The attention's node (q, k, v of (b·h, s, d) or (b, h, s, d)): the kernel function sees dense
    (b·h, s, d) copies, o and lse come back in the caller's shape, lse without a gradient, the
    gradients are SDPA's; the backward's route is asked of Python once a layout and set of enabled
    SDPA backends (here the math path, `backward` through Python: the CPU has no fused kernel);
    a call without grad makes no node and asks nothing; a saved q changed in place is refused."""
    from llmcompile.runtime import attention_backward as AB
    from llmcompile.specs.attention import ref_attention

    asked: list[tuple] = []
    backwards: list[int] = []

    def route(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, causal: bool, scale: float) -> tuple:
        assert q.dim() == 4 and o.stride() == q.stride()
        asked.append((tuple(q.shape), causal, scale))
        return AB.route(q, k, v, o, causal, scale)

    def backward(*args: object) -> tuple:
        backwards.append(1)
        return AB.backward(*args)

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> list[torch.Tensor]:
        assert not torch.is_grad_enabled() and all(
            t.is_contiguous() and t.dim() == 3 and not t.requires_grad for t in (q, k, v)
        )
        return ref_attention(True)(q, k, v, 0.5)

    ext.set_attention(route, backward)
    for lead in ((2, 3), (6,), (2, 3)):
        q, k = (torch.randn(*lead, 16, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
        v = torch.randn(16, *lead, 8, dtype=torch.float64).movedim(0, -2).requires_grad_()  # (strided: copied)
        dy = torch.randn(16, *lead, 8, dtype=torch.float64).movedim(0, -2)
        o, lse = ext.attention(fn, True, 0.5, q, k, v)
        assert o.grad_fn.name() == "llmcompile::AttentionNode" and not lse.requires_grad
        assert o.shape == q.shape and lse.shape == (*lead, 16)
        want = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5)
        torch.testing.assert_close(o, want)
        for g, r in zip(torch.autograd.grad(o, (q, k, v), dy), torch.autograd.grad(want, (q, k, v), dy)):
            torch.testing.assert_close(g, r)
    assert asked == [((2, 3, 16, 8), True, 0.5), ((1, 6, 16, 8), True, 0.5)] and len(backwards) == 3
    torch.backends.cuda.enable_flash_sdp(not torch.backends.cuda.flash_sdp_enabled())
    try:  # (another set of enabled backends, as `sdpa_kernel` makes: asked again)
        ext.attention(fn, True, 0.5, q, k, v)
    finally:
        torch.backends.cuda.enable_flash_sdp(not torch.backends.cuda.flash_sdp_enabled())
    assert len(asked) == 3
    o, lse = ext.attention(fn, True, 0.5, *(t.detach() for t in (q, k, v)))
    assert o.grad_fn is None and len(asked) == 3
    o, _ = ext.attention(fn, True, 0.5, q, k, v)
    with torch.no_grad():
        q.mul_(2.0)  # (a saved input: the node keeps q itself where it is already dense)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(o, q, dy)
    # a fused route (its extras None, as torch's dense forward gives them) is taken by the backward
    # itself: on the CPU, where torch has no such kernel, that kernel's own error comes back
    ext.set_attention(lambda *_: (AB.FLASH, None, None, None, None, 3), backward)
    q2 = q.detach().requires_grad_()
    o, _ = ext.attention(fn, True, 0.5, q2, k, v)
    with pytest.raises(RuntimeError, match="flash_attention_backward"):
        torch.autograd.grad(o, q2, dy)
    assert len(backwards) == 3


def test_the_attention_node_runs_the_fixed_layout_call_in_c(ext: object) -> None:
    """Once the kernel function has made its fixed-layout call in C (callpath's `fixed_caller`: a
    TVM-FFI stand-in here), the node's forward runs it from C++ (`forward_runs`' first count), not
    the kernel function, with SDPA's output and gradients; k of another shape goes to the kernel
    function's own call, which says what is wrong."""
    from llmcompile.specs.attention import ref_attention

    ran: list[float] = []
    caller = _attention_caller(lambda v, o, scale: ran.append(scale))

    class Fn:
        def __init__(self) -> None:
            self.calls = 0

        def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> list[torch.Tensor]:
            self.calls += 1
            if k.shape != q.shape:
                raise ValueError("k must be of q's shape")
            return ref_attention(True)(q, k, v, 0.5)

        def fixed_caller(self, q: torch.Tensor) -> object:
            return caller if q.shape == (6, 16, 8) else None

    fn = Fn()
    q, k = (torch.randn(2, 3, 16, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    v = torch.randn(16, 2, 3, 8, dtype=torch.float64).movedim(0, -2).requires_grad_()
    dy = torch.randn(2, 3, 16, 8, dtype=torch.float64)
    native, python = ext.forward_runs()
    o, lse = ext.attention(fn, True, 0.5, q, k, v)
    assert ext.forward_runs() == (native + 1, python) and ran == [0.5] and fn.calls == 0
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5)
    torch.testing.assert_close(o, want)
    for g, r in zip(torch.autograd.grad(o, (q, k, v), dy), torch.autograd.grad(want, (q, k, v), dy)):
        torch.testing.assert_close(g, r)
    with pytest.raises(ValueError, match="q's shape"):
        ext.attention(fn, True, 0.5, q, k[..., :12, :], v)
    assert ran == [0.5] and fn.calls == 1 and ext.forward_runs() == (native + 1, python + 1)


def test_the_attention_node_reads_a_strided_v_where_it_lies(ext: object) -> None:
    """A model's v, a strided (b, h, s, d) view, goes to the kernel function's `strided_v_call` as it
    is (q and k as dense (b·h, s, d), o made for it as q), not copied, and the gradients are SDPA's,
    v's among them; a layout that call refuses (None) is copied dense for the kernel function's own
    call; a dense v never reaches it (off the GPU: the backward is SDPA's math, not flash's)."""
    from llmcompile.runtime import attention_backward as AB
    from llmcompile.specs.attention import ref_attention

    class Fn:
        def __init__(self) -> None:
            self.calls, self.strided = 0, []

        def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> list[torch.Tensor]:
            assert v.is_contiguous() and v.dim() == 3
            self.calls += 1
            return ref_attention(True)(q, k, v, 0.5)

        def strided_v_call(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor) -> object:
            assert q.is_contiguous() and q.dim() == 3 and not v.is_contiguous() and not v.requires_grad
            assert o.shape == v.shape and o.is_contiguous()
            self.strided.append(v.stride())
            if v.shape[0] == 1:  # (a layout this kernel cannot take)
                return None
            out, lse = ref_attention(True)(q, k, v.reshape(-1, *v.shape[2:]), 0.5)
            o.copy_(out.view(o.shape))
            return lse

    ext.set_attention(AB.route, AB.backward)
    fn = Fn()
    for b in (2, 1):
        q, k = (torch.randn(b, 3, 16, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
        v = torch.randn(b, 16, 3, 8, dtype=torch.float64).transpose(1, 2).requires_grad_()
        dy = torch.randn(b, 3, 16, 8, dtype=torch.float64)
        runs = ext.strided_v_runs()
        o, lse = ext.attention(fn, True, 0.5, q, k, v)
        assert ext.strided_v_runs() == runs + (b == 2) and fn.calls == (b == 1)
        assert fn.strided[-1] == v.stride() and o.shape == q.shape and lse.shape == (b, 3, 16)
        want = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5)
        torch.testing.assert_close(o, want)
        for g, r in zip(torch.autograd.grad(o, (q, k, v), dy), torch.autograd.grad(want, (q, k, v), dy)):
            torch.testing.assert_close(g, r)
    ext.attention(fn, True, 0.5, q, k, v.detach().contiguous())
    assert len(fn.strided) == 2 and fn.calls == 2


def test_the_attention_node_writes_o_as_flash_attentions_backward_reads_it(ext: object) -> None:
    """Where the backward's route is flash-attention's (whose backward copies an o not laid out as
    (b, s, h, d), as torch's flash forward writes it), the node hands the strided-v call an o of that
    layout, for a strided v and a dense one alike; for another route, o laid out as q. Off the GPU
    the route is a stand-in, and only the forward runs."""
    from llmcompile.runtime import attention_backward as AB
    from llmcompile.specs.attention import ref_attention

    class Fn:
        def __init__(self) -> None:
            self.o_strides: list[tuple[int, ...]] = []

        def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> list[torch.Tensor]:
            raise AssertionError("the dense call, where the strided-v call takes it")

        def strided_v_call(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor) -> object:
            self.o_strides.append(o.stride())
            out, lse = ref_attention(True)(q, k, v.reshape(-1, *v.shape[2:]), 0.5)
            o.copy_(out.view(o.shape))
            return lse

    def flash(q: torch.Tensor, *_: object) -> tuple:
        return (AB.FLASH, None, None, None, None, 3)

    b, h, s, d = 2, 3, 16, 8
    fn = Fn()
    q, k = (torch.randn(b, h, s, d, dtype=torch.float64, requires_grad=True) for _ in range(2))
    strided = torch.randn(b, s, h, d, dtype=torch.float64).transpose(1, 2).requires_grad_()
    dense = strided.detach().contiguous().requires_grad_()
    try:
        ext.set_attention(flash, AB.backward)
        for v in (strided, dense):
            o, _ = ext.attention(fn, True, 0.5, q, k, v)
            assert o.stride() == (s * h * d, d, h * d, 1)  # (b, s, h, d) in memory
            torch.testing.assert_close(o, F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5))
        ext.set_attention(AB.route, AB.backward)  # (off the GPU: the math route)
        o, _ = ext.attention(fn, True, 0.5, q, k, strided)
        assert o.is_contiguous() and len(fn.o_strides) == 3
    finally:
        ext.set_attention(AB.route, AB.backward)


def test_the_attention_node_runs_the_strided_v_call_in_c(ext: object) -> None:
    """Once the kernel function gives its strided-v call in C (`strided_v_caller`: a TVM-FFI stand-in
    here), the node runs it from C++ with v as it lies and its own o, asking Python once a layout,
    never the Python call; SDPA's output and gradients."""
    from llmcompile.runtime import attention_backward as AB
    from llmcompile.runtime import native_call
    from llmcompile.runtime.native_call import OutputSpec
    from llmcompile.specs.attention import ref_attention

    tvm_ffi = pytest.importorskip("tvm_ffi")
    ran: list[tuple] = []
    caller = _attention_caller(lambda v, o, scale: ran.append((tuple(v.strides), tuple(o.strides))), strided=True)

    class Fn:
        def __init__(self) -> None:
            self.asked, self.calls = 0, 0

        def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> list[torch.Tensor]:
            self.calls += 1
            return ref_attention(True)(q, k, v, 0.5)

        def strided_v_caller(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor) -> object:
            self.asked += 1
            return caller

        def strided_v_call(self, *_: torch.Tensor) -> None:
            raise AssertionError("the Python call, where the C one was given")

    ext.set_attention(AB.route, AB.backward)
    fn = Fn()
    q, k = (torch.randn(2, 3, 16, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    v = torch.randn(2, 16, 3, 8, dtype=torch.float64).transpose(1, 2).requires_grad_()
    dy = torch.randn(2, 3, 16, 8, dtype=torch.float64)
    runs = ext.strided_v_runs()
    for _ in range(2):
        o, lse = ext.attention(fn, True, 0.5, q, k, v)
    assert fn.asked == 1 and fn.calls == 0 and ran == [(v.stride(), q.stride())] * 2
    assert ext.strided_v_runs() == runs + 2
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5)
    torch.testing.assert_close(o, want)
    for g, r in zip(torch.autograd.grad(o, (q, k, v), dy), torch.autograd.grad(want, (q, k, v), dy)):
        torch.testing.assert_close(g, r)
    # a call in C whose kernel refuses the tensors: the Python call takes this layout from then on
    refusing = native_call.make_caller(
        tvm_ffi.convert(lambda *_: (_ for _ in ()).throw(ValueError("refused"))), 4, [OutputSpec(0, "lead", "float64")],
        (0.5,), (), ("none",) * 4, ("float64",) * 4,
    )  # fmt: skip

    class Refused(Fn):
        def strided_v_caller(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor) -> object:
            self.asked += 1
            return refusing

        def strided_v_call(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor) -> object:
            self.calls += 1
            out, lse = ref_attention(True)(q, k, v.reshape(-1, *v.shape[2:]), 0.5)
            o.copy_(out.view(o.shape))
            return lse

    fn = Refused()
    for _ in range(2):
        o, _ = ext.attention(fn, True, 0.5, q, k, v)
    assert fn.asked == 1 and fn.calls == 2 and ext.strided_v_runs() == runs + 4
    torch.testing.assert_close(o, want)


def test_an_attentions_c_call_hands_sdpas_4d_calls_to_the_node_with_or_without_grad(ext: object) -> None:
    """An attention kernel function's C call (native_call's Entry, routed for x of 4 dims) hands a
    call with grad, and SDPA's 4-D call without grad, to the node's call (attention_with), never to
    Python: v strided read where it lies (`strided_v_call`), v dense by the fixed-layout call in C;
    a 3-D call without grad keeps its planned call, and one that call refuses takes the checked
    path (the node's own fallback calls the function so); a scale by keyword takes the Python call.
    o, lse and the gradients are SDPA's."""
    from llmcompile.runtime import attention_backward as AB
    from llmcompile.runtime import fixed_layout, native_call
    from llmcompile.specs.attention import ref_attention

    tvm_ffi = pytest.importorskip("tvm_ffi")
    if not native_call.available():
        pytest.skip(f"native_call did not build here: {native_call.reason()}")
    ran: list[int] = []
    shape = (6, 16, 8)

    def kernel(q: object, k: object, v: object, o: object, lse: object, scale: float) -> None:
        if tuple(q.shape) != shape or tuple(k.shape) != shape:  # (as the compiled kernel's own checks)
            raise ValueError(f"q, k, v of {shape}")
        ran.append(len(q.shape))
        out, s = ref_attention(True)(_by_address(q), _by_address(k), _by_address(v), scale)
        _by_address(o).copy_(out)
        _by_address(lse).copy_(s)

    f64 = torch.float64
    caller = fixed_layout.make_fixed_caller(
        tvm_ffi.convert(kernel), [(shape, f64)] * 3, [(shape, f64), (shape[:2], f64)], (0.5,)
    )

    class Fn(native_call.entry_base()):
        def __init__(self) -> None:
            self.python: list[dict] = []
            self.strided: list[tuple[int, ...]] = []

        def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **scalars: float) -> list[torch.Tensor]:
            self.python.append(scalars)
            return ref_attention(True)(q, k, v, scalars.get("scale", 0.5))

        def _checked_call(self, inputs: tuple[torch.Tensor, ...], scalars: dict) -> list[torch.Tensor]:
            return Fn.__call__(self, *inputs, **scalars)  # (the Python call itself, not the C one)

        def fixed_caller(self, q: torch.Tensor) -> object:
            return caller if tuple(q.shape) == shape else None

        def strided_v_call(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor) -> object:
            self.strided.append(v.stride())
            out, lse = ref_attention(True)(q, k, v.reshape(-1, *v.shape[2:]), 0.5)
            o.copy_(out.view(o.shape))
            return lse

    native_call.install(Fn)
    fn = Fn()
    fn._grad = True
    assert native_call.register(fn, "float64", 8, 2, caller)  # (x of 3 dims or more: the 2-D key)
    ext.set_attention(AB.route, AB.backward)
    ext.register_attention(7, fn, True, 0.5)
    native_call.set_node(fn, ext.grad_call, ext.ATTENTION + 7, ndim=4)
    q, k = (torch.randn(2, 3, 16, 8, dtype=f64) for _ in range(2))
    v = torch.randn(2, 16, 3, 8, dtype=f64).transpose(1, 2)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5)
    runs = ext.strided_v_runs()
    o, lse = fn(q, k, v)  # (4-D, v strided, no grad)
    assert ext.strided_v_runs() == runs + 1 and fn.strided == [v.stride()] and not fn.python and not ran
    torch.testing.assert_close(o, want)
    assert lse.shape == (2, 3, 16)
    o, _ = fn(q, k, v.contiguous())  # (4-D, v dense: the fixed-layout call in C, from the node)
    assert ran == [3] and not fn.python
    torch.testing.assert_close(o, want)
    o, _ = fn(*(t.reshape(shape) for t in (q, k, v)))  # (3-D: its planned call, straight)
    assert ran == [3, 3] and not fn.python
    fn(*(t.reshape(shape)[:3] for t in (q, k, v)))  # (refused by the planned call: the checked path)
    fn(*(t.reshape(shape) for t in (q, k, v)), scale=0.5)
    assert fn.python == [{}, {"scale": 0.5}] and ran == [3, 3]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o, _ = fn(*leaves)  # (with grad: the node)
    assert o.grad_fn.name() == "llmcompile::AttentionNode" and len(fn.python) == 2 and len(fn.strided) == 2
    refs = [t.clone().requires_grad_() for t in (q, k, v)]
    want = F.scaled_dot_product_attention(*refs, is_causal=True, scale=0.5)
    dy = torch.randn(2, 3, 16, 8, dtype=f64)
    for g, r in zip(torch.autograd.grad(o, leaves, dy), torch.autograd.grad(want, refs, dy)):
        torch.testing.assert_close(g, r)


def test_the_attention_kernel_functions_hand_their_4d_calls_to_the_node() -> None:
    """Each of `kernels.ATTENTIONS`, once the nodes are routed (`autograd._native`), hands SDPA's 4-D
    call without grad from its C call to its node's call (counted by `forward_runs`: off the GPU no
    call in C is planned, so the node calls the kernel function, which says what is wrong), and a
    3-D call keeps to the kernel function's own call (not counted). (Before any call in C is made in
    a process, the C call cannot see tensors: such a call takes the Python call, which hands it to
    the node's call too, `_strided_v_heads`.)"""
    from llmcompile import kernels
    from llmcompile.runtime import native_call

    ext = autograd._native()
    if ext is None or not native_call.available():
        pytest.skip("the C++ nodes or the C call did not build here")
    _attention_caller(lambda *_: None)  # (a call in C made first, as a process's first call makes one)
    for fn in kernels.ATTENTIONS:
        d = fn.spec.tensors[0].shape(6, 16)[-1]
        q = torch.randn(2, 3, 16, d, dtype=torch.bfloat16)
        v = torch.randn(2, 16, 3, d, dtype=torch.bfloat16).transpose(1, 2)
        for t, counted in ((q, 1), (q[0], 0)):
            _, python = ext.forward_runs()
            with pytest.raises(OpError, match="CUDA device"):
                fn(t, t, v if t.dim() == 4 else t)
            assert ext.forward_runs()[1] == python + counted, fn.spec.name


def test_a_functorch_wrapped_tensor_goes_to_the_python_call(ext: object, routed: list[tuple]) -> None:
    """grad_call's functorch guards, asked in C++: with the transform's layer keys taken out of the
    thread's dispatch keys (transforms then read as inactive), a tensor that grad or vmap wrapped
    still sends the call to the Python call; the same call on a plain tensor goes to the node."""
    from llmcompile import kernels

    layer_keys = torch._C._functorch._set_dynamic_layer_keys_included
    x = torch.randn(3, 40, dtype=torch.float64)

    def call_unlayered(t: torch.Tensor) -> torch.Tensor:
        assert torch._C._functorch.is_functorch_wrapped_tensor(t)
        layer_keys(False)
        try:
            assert not torch._C._are_functorch_transforms_active()
            kernels.softmax(t)
        finally:
            layer_keys(True)
        return (t * t).sum()

    torch.func.grad(call_unlayered)(x)
    assert routed == [("softmax", {})]
    plain = x.clone().requires_grad_()
    assert "Node" in kernels.softmax(plain).grad_fn.name() and len(routed) == 1
