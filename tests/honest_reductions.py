"""Honest reductions in every order a kernel may take, and near-misses that do less work, judged
by the verify stage's own rule (`verify.Reference`) on the verify stage's own inputs.

Each reduction (a kind along a shape) is computed in fp32 the ways real kernels do: threads each
walking a stretch in sequence and then a tree (as our templates), one tree over everything, bands
folded in a fixed order by a second pass, partials added in whatever order atomics land, and for
a mean, a var and a std / mean (ill-conditioned where the mean is near 0) Welford's running
updates or a block a thread (as the norm template), merged by Chan's formula; and three
near-misses: one row of the reduced axis left out (the middle one), the last one left out
(an off-by-one), and accumulators in fp16. Every honest order must pass on every input case
(random, spikes, integers, degenerate), each near-miss must fail on at least one; the margin of
each (its largest error over what the rule allows it) goes into the table.

tests/test_honest_reductions.py runs it small on the CPU and at >= 2^27 elements on the GPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from llmcompile.harness import verify
from llmcompile.specs import DTYPES, GENERIC_CASES, OpSpec, TensorDesc, generic_inputs
from llmcompile.specs.kernelbench import CUSTOM_TOL

KINDS = ("sum", "mean", "var", "norm", "logsumexp", "max", "cv")
# every honest order of these is exact on small integers, ended by nothing or by one division or root
EXACT = {"sum": "sum", "max": "sum", "mean": "divided", "norm": "divided"}


@dataclass(frozen=True)
class Shape:
    name: str
    shape: tuple[int, ...]
    dims: tuple[int, ...]  # the reduced dims

    def scaled(self, factor: int) -> Shape:
        """The same reduction with its largest dim divided by `factor` (the CPU's sizes)."""
        big = max(range(len(self.shape)), key=lambda d: self.shape[d])
        shape = tuple(s // factor if d == big else s for d, s in enumerate(self.shape))
        return Shape(self.name, shape, self.dims)


SHAPES = (
    Shape("last dim", (32768, 4096), (1,)),
    Shape("middle dim", (512, 1024, 256), (1,)),
    Shape("dim 0", (131072, 1024), (0,)),
    Shape("several dims", (128, 1024, 1024), (0, 2)),
    Shape("whole tensor", (1 << 27,), (0,)),
)
HONEST = (
    "threads then a tree",
    "one tree",
    "bands, fixed fold",
    "atomics",
    "Welford, then Chan's merges",
    "a block a thread, then Chan's merges",
)
# the orders that fold (count, mean, m2): any other kind takes the first order in their place
CHAN = HONEST[-2:]
NEAR_MISSES = ("a middle row left out", "the last row left out", "fp16 accumulators")


def _torch_reduce(kind: str, x: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    if kind == "sum":
        return x.sum(dims)
    if kind == "mean":
        return x.mean(dims)
    if kind == "var":
        return x.var(dims)
    if kind == "norm":
        return torch.linalg.vector_norm(x, 2, dims)
    if kind == "cv":  # (ill-conditioned where the mean is near 0: its rounding is amplified)
        return x.std(dims) / x.mean(dims)
    if kind == "logsumexp":
        return torch.logsumexp(x, dims)
    return x.amax(dims)


def spec_for(shape: Shape, kind: str) -> OpSpec:
    """The reduction as an op spec, as a KernelBench-format file of it loads (its tolerance
    included): a fixed shape, its float64 reference and torch's own program, exact where every
    honest order is."""
    dims = shape.dims
    kept = tuple(s for d, s in enumerate(shape.shape) if d not in dims)
    return OpSpec(
        f"{kind} over {shape.name}",
        f"torch {kind} over dims {dims} of {shape.shape}",
        (
            TensorDesc("x", tuple(str(s) for s in shape.shape)),
            TensorDesc("out", tuple(str(s) for s in kept) or ("1",), output=True),
        ),
        lambda x: [_torch_reduce(kind, x, dims).reshape(kept or (1,))],
        lambda m, n, dtype, gen, case, device: [
            torch.randn(shape.shape, generator=gen, device=gen.device).to(DTYPES[dtype]).to(device)
        ],
        torch_fn=lambda x: _torch_reduce(kind, x.float(), dims).to(x.dtype).reshape(kept or (1,)),
        tolerance=dict(CUSTOM_TOL),
        fixed_shapes=((shape.shape[0], shape.shape[-1]),),
        batchable=False,
        independent_rows=False,
        exact=EXACT.get(kind, ""),
    )


# ----------------------------------------------------------------------------------- the orders


def _as_rows(x: torch.Tensor, dims: tuple[int, ...]) -> tuple[torch.Tensor, tuple[int, ...]]:
    """x as (K, R): the reduced elements first, in fp32; and the kept dims' sizes."""
    kept = [d for d in range(x.dim()) if d not in dims]
    y = x.permute(*dims, *kept).float()
    return y.reshape(math.prod(x.shape[d] for d in dims), -1), tuple(x.shape[d] for d in kept)


def _threads(k: int) -> int:
    """Threads a reduction of k terms is spread over: each walks at most 1024 in sequence."""
    return max(1, min(k, max(256, k // 1024)))


def _tree(p: torch.Tensor) -> torch.Tensor:
    while p.shape[0] > 1:
        if p.shape[0] % 2:
            p = torch.cat([p[:-2], p[-2:-1] + p[-1:]])
        p = p[0::2] + p[1::2] if p.shape[0] > 1 else p
    return p[0]


def ordered_sum(t: torch.Tensor, order: str, acc: torch.dtype = torch.float32) -> torch.Tensor:
    """Sum of t (K, R) over K in fp32, in one of the honest orders (or in `acc` for the near-miss)."""
    k = t.shape[0]
    if order == "threads then a tree":
        threads = _threads(k)
        steps, rest = divmod(k, threads)
        parts = torch.zeros((threads, t.shape[1]), dtype=acc, device=t.device)
        for j in range(steps):  # thread i walks rows i*steps .. (i+1)*steps-1 in order
            parts += t[j : steps * threads : steps].to(acc)
        if rest:
            parts[:rest] += t[steps * threads :].to(acc)
        return _tree(parts.float())
    if order == "one tree":
        return _tree(t)
    if order == "bands, fixed fold":
        acc_ = torch.zeros(t.shape[1], device=t.device)
        for band in t.chunk(64):
            acc_ = acc_ + band.sum(0)
        return acc_
    if order == "atomics":
        parts = [c.sum(0) for c in t.chunk(4096)]
        gen = torch.Generator().manual_seed(7)
        acc_ = torch.zeros(t.shape[1], device=t.device)
        for i in torch.randperm(len(parts), generator=gen).tolist():
            acc_ = acc_ + parts[i]
        return acc_
    raise ValueError(order)


def welford(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(count, mean, M2) of t (K, R) over K in fp32 as a layernorm kernel makes them: each thread
    updates its running mean term by term, then the threads' triples are merged pairwise
    (Chan et al.), with divisions at every step: no order of these is exact on integers."""
    k = t.shape[0]
    threads = _threads(k)
    steps = k // threads
    cnt = torch.zeros(threads, t.shape[1], device=t.device)
    mean = torch.zeros_like(cnt)
    m2 = torch.zeros_like(cnt)
    for j in range(steps):
        v = t[j : steps * threads : steps]
        cnt += 1.0
        d = v - mean
        mean += d / cnt
        m2 += d * (v - mean)
    if steps * threads < k:  # (the tail, as one more thread's share)
        tail = t[steps * threads :]
        c2 = torch.full_like(cnt[:1], float(tail.shape[0]))
        cnt, mean, m2 = (
            torch.cat([cnt, c2]),
            torch.cat([mean, tail.mean(0, keepdim=True)]),
            torch.cat([m2, ((tail - tail.mean(0)) ** 2).sum(0, keepdim=True)]),
        )
    return _chan_tree(cnt, mean, m2)


def blocks_then_chan(t: torch.Tensor, block: int = 16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(count, mean, M2) of t (K, R) as the norm template folds it: each thread (32 of them for a
    row of up to 32K terms, more past it) takes its terms a block of `block` at a time, each block
    relative to its first term (m2 = sum d^2 - (sum d)^2 / n) and merged into the thread's triple
    (Chan et al.), then the threads' triples are merged pairwise."""
    k = t.shape[0]
    threads = min(k, max(32, k // 1024))
    steps = k // threads
    y = t[: steps * threads].reshape(steps, threads, -1)
    cnt = torch.zeros_like(y[0])
    mean, m2 = torch.zeros_like(cnt), torch.zeros_like(cnt)
    for lo in range(0, steps, block):
        b = y[lo : lo + block]
        d = b - b[:1]
        s, q = d.sum(0), (d * d).sum(0)
        cb = float(b.shape[0])
        mb, m2b = b[0] + s / cb, torch.clamp(q - s * s / cb, min=0.0)
        n = cnt + cb
        delta = mb - mean
        mean = torch.where(cnt == 0, mb, mean + delta * cb / n)
        m2 = m2 + m2b + delta * delta * cnt * cb / n
        cnt = n
    if steps * threads < k:  # (the tail, as one more thread's share)
        tail = t[steps * threads :]
        cnt = torch.cat([cnt, torch.full_like(cnt[:1], float(tail.shape[0]))])
        mean = torch.cat([mean, tail.mean(0, keepdim=True)])
        m2 = torch.cat([m2, ((tail - tail.mean(0)) ** 2).sum(0, keepdim=True)])
    return _chan_tree(cnt, mean, m2)


def _chan_tree(
    cnt: torch.Tensor, mean: torch.Tensor, m2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    while cnt.shape[0] > 1:
        if cnt.shape[0] % 2:
            cnt, mean, m2 = (torch.cat([x, torch.zeros_like(x[:1])]) for x in (cnt, mean, m2))
        ca, cb = cnt[0::2], cnt[1::2]
        n = ca + cb
        d = mean[1::2] - mean[0::2]
        w = torch.where(n > 0, cb / n.clamp(min=1), 0.0)
        mean = mean[0::2] + d * w
        m2 = m2[0::2] + m2[1::2] + d * d * ca * w
        cnt = n
    return cnt[0], mean[0], m2[0]


def reduce_fp32(kind: str, x: torch.Tensor, dims: tuple[int, ...], order: str, miss: str = "") -> torch.Tensor:
    """`kind` of x over `dims` computed in fp32 in `order`, or with the near-miss `miss`."""
    t, kept = _as_rows(x, dims)
    k = t.shape[0]
    acc = torch.float16 if miss == "fp16 accumulators" else torch.float32
    skip = {"a middle row left out": k // 2, "the last row left out": k - 1}.get(miss)
    fill = -math.inf if kind in ("max", "logsumexp") else 0.0
    if skip is not None:
        t = t.clone()
        t[skip] = fill
    if miss == "fp16 accumulators":
        order = "threads then a tree"

    def s(v: torch.Tensor) -> torch.Tensor:
        return ordered_sum(v, order if order not in CHAN else HONEST[0], acc)

    if order in CHAN and kind in ("mean", "var", "cv"):
        _, mean, m2 = welford(t) if order == CHAN[0] else blocks_then_chan(t)
        out = {"mean": mean, "var": m2 / (k - 1), "cv": torch.sqrt(m2 / (k - 1)) / mean}[kind]
    elif kind == "sum":
        out = s(t)
    elif kind == "mean":
        out = s(t) * (1.0 / k)
    elif kind in ("var", "cv"):
        mean = s(t) * (1.0 / k)
        d = t - mean
        if skip is not None:
            d[skip] = 0.0
        out = s(d * d) / (k - 1)
        out = torch.sqrt(out) / mean if kind == "cv" else out
    elif kind == "norm":
        out = torch.sqrt(s(t * t))
    elif kind == "logsumexp":
        m = t.amax(0)
        out = torch.log(s(torch.exp(t - m))) + m
    else:  # (in fp16 accumulators: the values rounded to fp16 on their way in)
        out = t.to(acc).amax(0).float()
    return out.reshape(kept or (1,))


# ------------------------------------------------------------------------------------ the verdict


@dataclass
class Judged:
    shape: str
    kind: str
    dtype: str
    impl: str
    honest: bool
    ratio: float  # the largest error over what the rule allows, over every case
    caught_by: str  # the first case on which it fails ("" when it passes them all)

    @property
    def accepted(self) -> bool:
        return not self.caught_by


def cases_for(spec: OpSpec, dtype: str, gen: torch.Generator, device: str) -> list[tuple[str, list[torch.Tensor]]]:
    base = spec.make_inputs(1, 1, dtype, gen, "random", device)
    out = [("random", base)]
    for case in GENERIC_CASES:
        made = generic_inputs(case, base, gen)
        if made is not None:
            out.append((case, made))
    return out


def judge_all(
    shape: Shape, kind: str, dtype: str, device: str, seed: int = 0, log: Callable[[str], None] = lambda s: None
) -> list[Judged]:
    """Every honest order and near-miss of one reduction, on every case the verify stage runs."""
    spec = spec_for(shape, kind)
    gen = torch.Generator(device=device).manual_seed(seed)
    impls = [(o, "", True) for o in HONEST] + [("threads then a tree", m, False) for m in NEAR_MISSES]
    worst = {(o, m): 0.0 for o, m, _ in impls}
    caught = {(o, m): "" for o, m, _ in impls}
    for case, inputs in cases_for(spec, dtype, gen, device):
        exact = spec.exact if case == "integers" else ""
        ref = verify.Reference(spec, dtype, inputs)
        fair = verify.Reference(spec, dtype, inputs, widen_by_own=False)
        if fair.check(ref.own or [], exact) is not None:
            log(
                f"{spec.name} {dtype}: case {case} skipped (torch's own output fails the bound, as the verify stage would)"
            )
            continue
        del fair
        for order, miss, _ in impls:
            got = reduce_fp32(kind, inputs[0], shape.dims, order, miss).to(DTYPES[dtype])
            r = ref.ratio([got], exact)
            worst[(order, miss)] = max(worst[(order, miss)], r)
            if ref.check([got], exact) is not None and not caught[(order, miss)]:
                caught[(order, miss)] = case
    return [
        Judged(shape.name, kind, dtype, miss or order, honest, worst[(order, miss)], caught[(order, miss)])
        for order, miss, honest in impls
    ]


def table(rows: list[Judged]) -> str:
    """The margins: honest orders' largest error over the bound (under 1: accepted, and how far
    under), near-misses' (over 1 on the case named: rejected)."""
    out = [
        "| reduction | shape | dtype | honest: worst error / bound (order) | near-miss: caught on (error / bound) |",
        "|---|---|---|---|---|",
    ]
    keys = list(dict.fromkeys((r.kind, r.shape, r.dtype) for r in rows))
    for kind, shape, dtype in keys:
        mine = [r for r in rows if (r.kind, r.shape, r.dtype) == (kind, shape, dtype)]
        honest = max((r for r in mine if r.honest), key=lambda r: r.ratio)
        ok = all(r.accepted for r in mine if r.honest)
        misses = "; ".join(f"{r.impl}: {r.caught_by or 'NOT CAUGHT'} ({r.ratio:.3g})" for r in mine if not r.honest)
        out.append(
            f"| {kind} | {shape} | {dtype} | {honest.ratio:.3g} ({honest.impl}){'' if ok else ' REJECTED'} | {misses} |"
        )
    return "\n".join(out)
