"""A training step's cost of each op, as a training loop calls it: the forward through autograd,
then the gradients of `(out * dy).sum()` (of `loss.sum()` for the per-row cross-entropy, whose
upstream gradient then arrives expanded, stride 0), for ours beside QuACK's, Liger's, torch eager
and torch.compile, on the same rotated input sets (cold L2), under CUDA graphs or from eager calls.

The rate divides the minimum bytes of the op's forward kernel and its backward kernel (what the
two must move between them) by the step's time; what a step adds besides (the `* dy` and the
sums, autograd's bookkeeping) is the same for every implementation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F

from llmcompile.bench import timing
from llmcompile.bench.baselines import Unavailable
from llmcompile.bench.grid import BenchResult, BenchRow, median_round, time_in_turns, until_interrupted, versions
from llmcompile.specs import OpSpec, get_op

# the ops a training step calls, and the backward op whose bytes the step also moves
TRAIN_OPS = {
    "softmax": "softmax_bwd",
    "log_softmax": "log_softmax_bwd",
    "rmsnorm": "rmsnorm_bwd",
    "layernorm": "layernorm_bwd",
    "cross_entropy": "cross_entropy_bwd",
}
TRAIN_IMPLS = ("llmcompile", "eager", "compile", "quack", "liger")


def _torch_op(op: str, n: int, scalars: dict) -> Callable[..., torch.Tensor]:
    """The op as a user writes it in torch (differentiable, in the inputs' dtype)."""
    if op == "softmax":
        return lambda x: torch.softmax(x, dim=-1)
    if op == "log_softmax":
        return lambda x: torch.log_softmax(x, dim=-1)
    if op == "rmsnorm":
        return lambda x, w: F.rms_norm(x, (n,), w, scalars["eps"])
    if op == "layernorm":
        return lambda x, w, b: F.layer_norm(x, (n,), w, b, scalars["eps"])
    if op == "cross_entropy":
        return lambda x, t: F.cross_entropy(x, t, ignore_index=scalars["ignore_index"], reduction="none")
    raise Unavailable(f"no training step for {op}")


def _ours(op: str, n: int, scalars: dict) -> Callable[..., torch.Tensor]:
    from llmcompile import kernels

    fn = kernels.BY_NAME[op]
    if op in ("rmsnorm", "layernorm"):  # eps by keyword, as a model passes it
        return lambda *ins: fn(*ins, eps=scalars["eps"])
    return fn


def _quack(op: str, n: int, scalars: dict) -> Callable[..., torch.Tensor]:
    try:
        import quack
    except Exception as e:  # noqa: BLE001 - any import failure means "not here"
        raise Unavailable(f"quack not importable: {type(e).__name__}") from None
    if op == "softmax":
        return quack.softmax
    if op == "rmsnorm":
        return lambda x, w: quack.rmsnorm(x, w, eps=scalars["eps"])
    if op == "cross_entropy":
        return lambda x, t: quack.cross_entropy(x, t, reduction="none", ignore_index=scalars["ignore_index"])
    raise Unavailable(f"QuACK has no differentiable {op}")


def _liger(op: str, n: int, scalars: dict) -> Callable[..., torch.Tensor]:
    try:
        from liger_kernel.transformers import functional as lf
    except Exception as e:  # noqa: BLE001
        raise Unavailable(f"liger not importable: {type(e).__name__}") from None
    if op == "softmax":
        if not hasattr(lf, "liger_softmax"):  # (added to Liger after 0.5)
            raise Unavailable("this Liger has no softmax")
        return lf.liger_softmax
    if op == "rmsnorm":
        return lambda x, w: lf.liger_rms_norm(x, w, scalars["eps"])
    if op == "layernorm":
        return lambda x, w, b: lf.liger_layer_norm(x, w, b, scalars["eps"])
    if op == "cross_entropy":
        return lambda x, t: lf.liger_cross_entropy(x, t, ignore_index=scalars["ignore_index"], reduction="none")
    raise Unavailable(f"Liger has no {op}")


def _compiled(op: str, n: int, scalars: dict) -> Callable[..., torch.Tensor]:
    torch._dynamo.reset()
    return torch.compile(_torch_op(op, n, scalars), dynamic=False)


IMPLS: dict[str, Callable[[str, int, dict], Callable[..., torch.Tensor]]] = {
    "llmcompile": _ours,
    "eager": _torch_op,
    "compile": _compiled,
    "quack": _quack,
    "liger": _liger,
}


def step(op: str, fn: Callable[..., torch.Tensor], ins: list[torch.Tensor], seed: int = 0) -> Callable[[], object]:
    """One training step of `fn` on `ins`: the floating inputs are leaves that require grad (a
    norm's weight too), the gradients taken with torch.autograd.grad (nothing accumulates in
    .grad between steps). The upstream gradient dy is random, made once."""
    leaves = [t.detach().clone().requires_grad_() if t.is_floating_point() else t for t in ins]
    wrt = [t for t in leaves if t.requires_grad]
    if op == "cross_entropy":

        def run() -> object:
            return torch.autograd.grad(fn(*leaves).sum(), wrt)

        return run
    gen = torch.Generator(device=ins[0].device).manual_seed(seed)
    dy = torch.randn(ins[0].shape, device=ins[0].device, dtype=ins[0].dtype, generator=gen)

    def run() -> object:
        return torch.autograd.grad((fn(*leaves) * dy).sum(), wrt)

    return run


def work(op: str, m: int, n: int, dtype: str) -> int:
    """The bytes a step's forward and backward kernels must move between them, at the least."""
    return get_op(op).bytes_moved(m, n, dtype) + get_op(TRAIN_OPS[op]).bytes_moved(m, n, dtype)


def bench_step(
    spec: OpSpec, m: int, n: int, dtype: str, sol_tbs: float, impls: Iterable[str], graph: bool, rounds: int = 1
) -> list[BenchRow]:
    """Each implementation's step on the same rotated input sets, in turns (`rounds`), each
    keeping its median round; one that cannot run says why in its row."""
    gen = torch.Generator().manual_seed(0)
    bytes_ = work(spec.name, m, n, dtype)
    count = timing.rotation_count(bytes_)
    sets = [spec.make_inputs(m, n, dtype, gen, "random", "cuda") for _ in range(count)]
    calls: dict[str, list[Callable[[], object]]] = {}
    errors: dict[str, str] = {}
    for name in impls:
        try:
            fn = IMPLS[name](spec.name, n, dict(spec.scalars))
            calls[name] = [step(spec.name, fn, s, i) for i, s in enumerate(sets)]
        except Unavailable as e:
            errors[name] = str(e)
    timings = time_in_turns(calls, rounds, graph, errors)
    rows = []
    for name in impls:
        if name in errors or name not in timings:
            rows.append(BenchRow(spec.name, dtype, m, n, name, None, None, None, errors.get(name, "not run")))
            continue
        t = median_round(timings[name])
        rate = timing.tbs(bytes_, t.median_ms)
        note = "no graph" if graph and not t.graph else ""
        each = [x.median_ms for x in timings[name]]
        rows.append(BenchRow(spec.name, dtype, m, n, name, t.median_ms, rate, 100 * rate / sol_tbs, note, "TB/s", each))
    del sets, calls
    torch.cuda.empty_cache()
    return rows


def run(
    ops: list[str],
    dtypes: list[str],
    shapes: list[tuple[int, int]] | None,
    impls: list[str],
    graph: bool = True,
    rounds: int = 1,
    progress: Callable[[str], None] = print,
    copy_kernel: Callable[[torch.Tensor, torch.Tensor], object] | None = None,
) -> BenchResult:
    """The training step of each op, dtype and shape (None: each op's own grid)."""
    copies = timing.copy_bandwidths({"cute copy": copy_kernel} if copy_kernel else None)
    sol = max(copies.values())
    result = BenchResult(torch.cuda.get_device_name(0), sol, versions(), copies=copies, graph=graph)
    progress("device copy bandwidth (SOL): " + ", ".join(f"{k} {v:.3f}" for k, v in copies.items()) + " TB/s")
    warm = False
    with until_interrupted(result, progress):
        for op in ops:
            spec = get_op(op)
            for dtype in dtypes:
                for m, n in shapes if shapes is not None else spec.shapes():
                    if not warm:
                        # The process's first point, measured once and dropped: it carries one-time
                        # costs (lazy module loads, allocator growth) for every implementation but
                        # torch's own ops. Eagerly on the H100, ours, QuACK's and Liger's first point
                        # (softmax fp32 32768 x 256) took 2-3x its time at N = 512; torch's did not.
                        bench_step(spec, m, n, dtype, sol, impls, graph, 1)
                        warm = True
                    rows = bench_step(spec, m, n, dtype, sol, impls, graph, rounds)
                    result.rows.extend(rows)
                    progress(
                        f"train {op:13s} {dtype:8s} M={m:<8d} N={n:<7d} "
                        + "  ".join(f"{r.impl}={r.ms * 1e3:.1f}us" if r.ms else f"{r.impl}=n/a" for r in rows)
                    )
    return result
