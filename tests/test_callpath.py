"""CPU (CI): what the lean call path decides once per (dtype, N), and what it refuses."""

from __future__ import annotations

import pytest
import torch

from llmcompile.runtime.callpath import KernelFunction
from llmcompile.runtime.callspec import CallSpec
from llmcompile.specs import OpError, TensorDesc, get_op


def test_the_plan_holds_what_a_fast_call_checks() -> None:
    asked: list[tuple[str, int]] = []
    fn = KernelFunction(get_op("cross_entropy"), lambda dtype, n: asked.append((dtype, n)) or "kernel")
    fn._plan("bfloat16", 4096)
    plan = fn._plans[(torch.bfloat16, 4096)]
    assert asked == [("bfloat16", 4096)] and plan.fn == "kernel"
    assert plan.rest == (("M", torch.int64),) and plan.outs == (("M", torch.float32),) and plan.values == (-100,)
    fn._plan("bfloat16", 4096)
    assert asked == [("bfloat16", 4096)]  # compiled once
    norm = KernelFunction(get_op("rmsnorm"), lambda dtype, n: "kernel")
    norm._plan("float16", 1024)
    plan = norm._plans[(torch.float16, 1024)]
    assert plan.rest == (("N", torch.float16),) and plan.outs == (("like", torch.float16),)  # made like x


def test_a_plan_makes_each_output_like_an_input_of_its_shape() -> None:
    ce = KernelFunction(get_op("cross_entropy"), lambda dtype, n: "kernel")
    ce._plan("bfloat16", 64)
    plan = ce._plans[(torch.bfloat16, 64)]
    logits, target = torch.randn(5, 64, dtype=torch.bfloat16), torch.arange(5)
    loss = plan.alloc((logits, target))
    assert plan.one and plan.arity == 2 and loss.shape == (5,) and loss.dtype == torch.float32
    norm = KernelFunction(get_op("rmsnorm"), lambda dtype, n: "kernel")
    norm._plan("float16", 32)
    x = torch.randn(3, 32, dtype=torch.float16)
    out = norm._plans[(torch.float16, 32)].alloc((x, torch.ones(32, dtype=torch.float16)))
    assert out.shape == x.shape and out.dtype == x.dtype and out.data_ptr() != x.data_ptr()


class _Recorder:
    """A stand-in for a compiled function: records its arguments, or refuses them as the C checks do."""

    def __init__(self, refuse: bool = False) -> None:
        self.calls: list[tuple] = []
        self.refuse = refuse

    def __call__(self, *args: object) -> None:
        self.calls.append(args)
        if self.refuse:
            raise ValueError("Mismatched Tensor on argument #0")


def test_a_fast_call_hands_the_inputs_its_outputs_and_the_scalars_to_the_function() -> None:
    rec = _Recorder()
    fn = KernelFunction(get_op("rmsnorm"), lambda dtype, n: rec)
    fn._plan("float32", 16)
    x, w = torch.randn(4, 16), torch.randn(16)
    out = fn(x, w)
    (args,) = rec.calls
    assert args[0] is x and args[1] is w and args[2] is out and args[3] == 1e-6
    assert out.shape == (4, 16) and out.dtype == torch.float32


def test_rows_of_one_input_and_one_output_like_it_take_the_shortest_call() -> None:
    rec = _Recorder()
    fn = KernelFunction(get_op("softmax"), lambda dtype, n: rec)
    fn._plan("bfloat16", 8)
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    out = fn(x)
    assert rec.calls == [(x, out)] and out.shape == x.shape and out.dtype == x.dtype
    with pytest.raises(OpError, match="CUDA device"):  # leading dims: the view path, which checks in Python
        fn(x.view(1, 3, 8))
    with pytest.raises(OpError, match="no argument"):
        fn(x, beta=1.0)
    assert len(rec.calls) == 1


def test_a_call_the_function_refuses_is_taken_again_on_the_checked_path() -> None:
    rec = _Recorder(refuse=True)
    fn = KernelFunction(get_op("rmsnorm"), lambda dtype, n: rec)
    fn._plan("float32", 16)
    with pytest.raises(OpError, match="CUDA device"):  # the checked path's word, not the C message
        fn(torch.randn(4, 16), torch.randn(16))
    assert len(rec.calls) == 1
    with pytest.raises(OpError, match="takes 2 tensors"):  # a wrong count never reaches the function
        fn(torch.randn(4, 16))
    assert len(rec.calls) == 1


def test_sums_over_rows_keep_their_shape_on_the_fast_path_too() -> None:
    """A norm backward's dw (N,) is not a row output: leading dims of x do not reshape it (they
    once tried to), and a fast call makes it of shape (N,)."""
    from llmcompile.runtime.plans import shaped

    dx, dw = shaped([torch.zeros(6, 4), torch.ones(4)], torch.Size([2, 3]), (True, False))
    assert dx.shape == (2, 3, 4) and dw.shape == (4,)
    rec = _Recorder()
    fn = KernelFunction(get_op("rmsnorm_bwd"), lambda dtype, n: rec)
    assert fn._row_outputs == (True, False)
    fn._plan("float32", 16)
    assert fn._plans[(torch.float32, 16)].outs == (("like", torch.float32), ("N", torch.float32))
    dy, x, w, rstd = torch.randn(4, 16), torch.randn(4, 16), torch.randn(16), torch.rand(4)
    dx, dw = fn(dy, x, w, rstd)
    assert dx.shape == (4, 16) and dw.shape == (16,) and dw.dtype == torch.float32
    ((*ins, out_dx, out_dw),) = rec.calls
    assert out_dx is dx and out_dw is dw and ins == [dy, x, w, rstd]


def test_a_small_input_of_its_own_shape_keeps_the_fast_call() -> None:
    """The fused cross-entropy's upstream scale (1,) fits no rows: the C checks see its shape."""
    rec = _Recorder()
    fn = KernelFunction(get_op("cross_entropy_fused"), lambda dtype, n: rec)
    fn._plan("bfloat16", 64)
    plan = fn._plans[(torch.bfloat16, 64)]
    assert plan.rest == (("M", torch.int64), ("fixed", torch.float32))
    logits, target, scale = torch.randn(5, 64, dtype=torch.bfloat16), torch.arange(5), torch.ones(1)
    loss, dx = fn(logits, target, scale)
    assert loss.shape == (5,) and loss.dtype == torch.float32 and dx.shape == logits.shape
    assert rec.calls[0][:3] == (logits, target, scale) and rec.calls[0][5:] == (-100,)


def test_outputs_of_one_value_keep_the_fast_call() -> None:
    """The fused loss's totals (sum, mean, 1/kept: (1,) each) are made (1,) on the fast call; an
    op with them once took the checked path every call (+140 us of host a loss step, H200)."""
    rec = _Recorder()
    fn = KernelFunction(get_op("cross_entropy_fused_total"), lambda dtype, n: rec)
    fn._plan("bfloat16", 64)
    plan = fn._plans[(torch.bfloat16, 64)]
    assert plan.outs[2:] == (("one", torch.float32),) * 3
    logits, target = torch.randn(5, 64, dtype=torch.bfloat16), torch.arange(5)
    loss, dx, *totals = fn(logits, target)
    assert loss.shape == (5,) and dx.shape == logits.shape and [t.shape for t in totals] == [(1,)] * 3
    assert len(rec.calls) == 1 and rec.calls[0][7:] == (-100,)


def test_fixed_shape_problems_always_take_the_checked_path() -> None:
    out = TensorDesc("out", ("M", "3", "N"), None, True)
    spec = CallSpec("p", (TensorDesc("x", ("M", "3", "N")), out), {}, ("float32",))
    fn = KernelFunction(spec, lambda dtype, n: "kernel")
    fn._plan("float32", 8)
    assert not fn._plans and (torch.float32, 8) in fn._unplanned  # decided once, not at every call


def test_the_checked_path_says_what_is_wrong() -> None:
    fn = KernelFunction(get_op("rmsnorm"), lambda dtype, n: "kernel")
    with pytest.raises(OpError, match="CUDA device"):
        fn(torch.randn(4, 8), torch.randn(8))
    with pytest.raises(OpError, match="takes 2 tensors"):
        fn(torch.randn(4, 8))
    with pytest.raises(OpError, match="no argument"):
        fn(torch.randn(4, 8), torch.randn(8), epsilon=1.0)
    loaded = KernelFunction(get_op("softmax"), None, precompiled={("bfloat16", 1024): "kernel"})
    with pytest.raises(OpError, match="has kernels for bfloat16 N=1024, not float32 N=4096"):
        loaded.compiled("float32", 4096)


@pytest.mark.gpu
def test_the_fast_call_matches_the_checked_one_and_falls_back_where_it_must() -> None:
    from llmcompile import kernels

    fn = kernels.rmsnorm
    x = torch.randn(4, 7, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.rand(1024, device="cuda", dtype=torch.bfloat16) + 0.5
    first = fn(x, w)  # the checked path, which plans
    assert (torch.bfloat16, 1024) in fn._plans
    fast = fn(x, w)
    assert fast.shape == x.shape and torch.equal(first, fast)
    strided = x.transpose(0, 1).contiguous().transpose(0, 1)  # same values, not contiguous
    assert torch.equal(fn(strided, w), first)
    assert torch.equal(fn(x, w, eps=1e-6), first)  # a scalar given: the checked path
    with pytest.raises(OpError, match="weight"):
        fn(x, w[:512])
    with pytest.raises(OpError, match="weight"):
        fn(x, w.double())  # (fp32 weights take their own kernel: vectors32)
    ce = kernels.cross_entropy
    logits = torch.randn(6, 4096, device="cuda", dtype=torch.bfloat16)
    target = torch.randint(0, 4096, (6,), device="cuda")
    ce(logits, target)
    assert torch.equal(ce(logits, target), ce(logits, target.clone()))
    with pytest.raises(OpError, match="target"):
        ce(logits, target[:5])  # a short target must not be read past its end
    with pytest.raises(OpError, match="target"):
        ce(logits, target.int())
    # rows as they come (2-D): the fast call, whose function checks in C what the checked path
    # would; what it refuses is taken again on the checked path
    rows = x.view(-1, 1024)
    want = fn(rows, w)
    assert torch.equal(want, first.view(-1, 1024))
    buf = torch.empty(rows.numel() + 1, device="cuda", dtype=torch.bfloat16)
    unaligned = buf[1:].view_as(rows)
    unaligned.copy_(rows)
    assert unaligned.data_ptr() % 16 and torch.equal(fn(unaligned, w), want)
    wide = torch.empty(rows.shape[0], 1536, device="cuda", dtype=torch.bfloat16)
    wide[:, :1024] = rows
    assert torch.equal(fn(wide[:, :1024], w), want)  # rows 1536 apart
    assert torch.equal(fn(rows.t().contiguous().t(), w), want)  # column-major
    with pytest.raises(OpError, match="weight"):
        fn(rows, w.double())
    with pytest.raises(OpError, match="weight"):
        fn(rows, w[:512])
    with pytest.raises(OpError, match="CUDA device"):
        fn(rows.cpu(), w)
    # the fast calls' outputs are made in C where native_call builds (it does on the H100 machine)
    from llmcompile.runtime import native_call

    assert native_call.available(), native_call.reason()
    assert native_call.is_caller(fn._fast[(torch.bfloat16, 1024, 2)])
    assert native_call.is_caller(ce._fast[(torch.bfloat16, 4096, 2)])
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # the env stream TVM-FFI sets is the caller's current one
        on_side = fn(rows, w)
    side.synchronize()
    assert torch.equal(on_side, want)


# a slice of wider rows, each op's inputs after x: (shape, dtype) given x's (M, N) and dtype
_SLICED = {
    "softmax": (),
    "log_softmax": (),
    "rmsnorm": (("N", None),),
    "layernorm": (("N", None), ("N", None)),
    "cross_entropy": (("M", torch.int64),),
}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("op", sorted(_SLICED))
def test_a_slice_of_wider_rows_is_read_where_it_lies(op: str, dtype: torch.dtype) -> None:
    """x[:, :N] of wider rows (and x[..., N:2N] of 3-D activations) takes the kernel compiled for
    strided rows: the same bits as the dense call on a copy, no copy made, its C call kept."""
    from llmcompile import kernels
    from llmcompile.runtime import native_call

    fn = kernels.BY_NAME[op]
    m, n, width = 96, 1024, 3072
    wide = torch.randn(m, width, device="cuda", dtype=dtype)
    rest = [
        torch.randint(0, n, (m,), device="cuda")
        if d == torch.int64
        else torch.rand(n, device="cuda", dtype=dtype) + 0.5
        for _, d in _SLICED[op]
    ]
    dense = fn(wide[:, n : 2 * n].contiguous(), *rest)  # (plans the fast call too)
    for x in (wide[:, n : 2 * n], wide[:, n : 2 * n], wide.view(8, 12, width)[..., n : 2 * n]):
        got = fn(x, *([r.view(8, 12) for r in rest] if x.dim() == 3 and op == "cross_entropy" else rest))
        assert torch.equal(got.reshape(dense.shape), dense), op
    assert fn._strided.get((str(dtype).removeprefix("torch."), n)) is not None
    if native_call.available():
        assert native_call.is_caller(fn._fast[(dtype, n, 2)])


@pytest.mark.gpu
def test_torch_compile_fullgraph_calls_the_op() -> None:
    from llmcompile import kernels

    x = torch.randn(3, 5, 2048, device="cuda", dtype=torch.bfloat16)
    want = kernels.softmax(x) * 2
    got = torch.compile(lambda t: kernels.softmax(t) * 2, fullgraph=True)(x)
    assert torch.equal(got, want)


@pytest.mark.gpu
def test_on_a_host_of_several_gpus_calls_on_either_start_in_c_and_are_right() -> None:
    """Two GPUs in one process (run without pytest-xdist's spread, which shows each worker one):
    plain calls, a keyword eps and a training step on either GPU run from C, as on one, with the
    current device left at 0; tensors on two devices are refused before any launch."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs in this process")
    import torch.nn.functional as F

    from llmcompile import kernels
    from llmcompile.runtime import autograd_native

    torch.cuda.set_device(0)
    node = autograd_native.module()
    for dev in ("cuda:1", "cuda:0"):
        x = torch.randn(64, 1024, device=dev, dtype=torch.bfloat16)
        w = torch.rand(1024, device=dev, dtype=torch.bfloat16) + 0.5
        for _ in range(2):  # (the first call plans)
            y, n = kernels.softmax(x), kernels.rmsnorm(x, w, eps=1e-5)
        c_calls = kernels.softmax._c_calls()
        assert c_calls >= 1 and y.device == x.device == n.device
        torch.testing.assert_close(y.double(), torch.softmax(x.double(), -1), atol=2e-3, rtol=2e-2)
        torch.testing.assert_close(n.double(), F.rms_norm(x.double(), (1024,), w.double(), 1e-5), atol=2e-2, rtol=2e-2)
        xg = x.clone().requires_grad_()
        torch.autograd.grad((kernels.softmax(xg) * y).sum(), xg)  # (the first backward plans its kernel)
        before = node.backward_runs() if node is not None else None
        (g,) = torch.autograd.grad((kernels.softmax(xg) * y).sum(), xg)
        xd = x.double().requires_grad_()
        (want,) = torch.autograd.grad((torch.softmax(xd, -1) * y.double()).sum(), xd)
        torch.testing.assert_close(g.double(), want, atol=2e-3, rtol=5e-2)
        if node is not None:  # (the backward launched from C++, on this GPU's autograd thread)
            assert node.backward_runs()[0] == before[0] + 1
    assert torch.cuda.current_device() == 0
    x0 = torch.randn(64, 1024, device="cuda:0", dtype=torch.bfloat16)
    w1 = torch.rand(1024, device="cuda:1", dtype=torch.bfloat16)
    with pytest.raises(OpError, match="weight is on cuda:1, x on cuda:0"):  # (the checked path, after C refused)
        kernels.rmsnorm(x0, w1)
