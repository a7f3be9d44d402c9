"""Every reference kernel against a float64 reference on the GPU, over the dtype x N x M grid."""

from __future__ import annotations

import pytest

from llmcompile.agent.offline import ATTENTION_KNOBS, knob_fields
from llmcompile.harness.verify import compare, poison
from llmcompile.specs import BUILTIN, OpError
from reference_kernels.cross_entropy_total import PARTS

pytestmark = pytest.mark.gpu

# N: powers of two, the long-vocabulary sizes, one not a multiple of 8, one odd (scalar path)
NS = (256, 1024, 2048, 4096, 5000, 16384, 65536, 128256, 151936, 262144, 4100, 5001)
DTYPES = ("float32", "bfloat16", "float16")
MAX_ELEMS = 1 << 24
# the row kernels; attention (fixed (M, N, D) layout, its own grid) is tested below
ROW_OPS = sorted(op for op, spec in BUILTIN.items() if not spec.compute_bound)
ATTENTION = sorted(op for op, spec in BUILTIN.items() if spec.compute_bound)


def ms_for(n: int) -> tuple[int, ...]:
    big = max(3, min(4099, MAX_ELEMS // n) | 1)
    return tuple(dict.fromkeys((1, 3, 64, big)))


def _run(op: str, m: int, n: int, dtype: str, case: str, seed: int, knobs: dict | None = None):
    import torch

    from llmcompile import kernels
    from reference_kernels.reduce import RowKnobs

    spec = BUILTIN[op]
    fn = kernels.BY_NAME[op] if knobs is None else kernels.reference_function(op, RowKnobs(**knobs))
    gen = torch.Generator().manual_seed(seed)
    inputs = spec.make_inputs(m, n, dtype, gen, case, "cuda")
    outs = spec.alloc_outputs(m, n, dtype, "cuda")
    poison(outs)
    fn.compiled(dtype, n)(*inputs, *outs, *spec.scalars.values())
    torch.cuda.synchronize()
    return compare(spec, dtype, inputs, outs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("op", ROW_OPS)
def test_matches_float64_reference(op: str, n: int, dtype: str) -> None:
    failures = []
    for i, m in enumerate(ms_for(n)):
        bad = _run(op, m, n, dtype, "random", seed=1000 * i + n)
        if bad:
            failures.append(f"M={m}: {bad.describe()}")
    big = ms_for(n)[-1]
    for case in BUILTIN[op].cases[1:]:
        bad = _run(op, big, n, dtype, case, seed=7 + n)
        if bad:
            failures.append(f"M={big} {case}: {bad.describe()}")
    assert not failures, "\n".join(failures)


# Short rows where a table picks a mode of its own (the cross-entropy index staged at bf16 512;
# LayerNorm's fp32 weight and bias through shared memory up to 512, and 64 threads a row at fp32
# 1024 and 16-bit 257-512; cross_entropy_bwd's 256 threads up to fp32 2048; rmsnorm_bwd's 4 CTAs
# a SM at bf16 1024), at N off the grid above: partial vectors, an odd N, each table row's bounds.
SHORT_ROWS = (
    ("cross_entropy", "bfloat16", 509), ("cross_entropy", "bfloat16", 512), ("cross_entropy_fwd", "bfloat16", 260),
    ("cross_entropy_fwd", "float16", 500), ("layernorm", "float32", 257), ("layernorm", "float32", 509),
    ("layernorm", "float32", 1000), ("layernorm_fwd", "float32", 300), ("layernorm_fwd", "float32", 1023),
    ("cross_entropy_bwd", "float32", 1025), ("cross_entropy_bwd", "float32", 2047), ("rmsnorm_bwd", "bfloat16", 1000),
    ("rmsnorm_bwd", "float16", 777), ("layernorm", "bfloat16", 509), ("layernorm_fwd", "float16", 300),
)  # fmt: skip


@pytest.mark.parametrize(("op", "dtype", "n"), SHORT_ROWS)
def test_short_row_table_modes_match_float64_reference(op: str, dtype: str, n: int) -> None:
    failures = []
    for i, m in enumerate((1, 3, 2049)):
        bad = _run(op, m, n, dtype, "random", seed=17 * i + n)
        if bad:
            failures.append(f"M={m}: {bad.describe()}")
    for case in BUILTIN[op].cases[1:]:
        bad = _run(op, 2049, n, dtype, case, seed=5 + n)
        if bad:
            failures.append(f"M=2049 {case}: {bad.describe()}")
    assert not failures, "\n".join(failures)


LOOP_KNOBS = (
    {"row_loop": 2, "stage_smem": False, "prefetch_registers": False},
    {"row_loop": 3, "stage_smem": True},
    {"row_loop": 4, "stage_smem": True, "columns": "smem"},
    {"row_loop": 5, "stage_smem": False, "columns": "early", "prefetch_registers": True},
    {"row_loop": 3, "stage_smem": False, "threads_per_row": 512, "columns": "smem", "prefetch_registers": True},
    {"row_loop": 2, "stage_smem": True, "online": False},  # two reductions a tile, one prefetch
)


@pytest.mark.parametrize("knobs", LOOP_KNOBS, ids=str)
@pytest.mark.parametrize("n", (1000, 5001, 65536, 262144))
@pytest.mark.parametrize("op", sorted(set(ROW_OPS) - {"copy"}))
def test_row_loop_matches_float64_reference(op: str, n: int, knobs: dict) -> None:
    """A CTA on several row tiles in turn: M not a multiple of the loop (CTAs whose last
    tiles are past M) and every tile a different row, in both widths. Staged, each tile's
    successor is copied into the buffer it was read from, during its reduction; with
    prefetch_registers, into the registers it was read from."""
    failures = []
    for dtype in ("bfloat16", "float32"):
        for i, m in enumerate((1, 7, min(1023, MAX_ELEMS // n) | 1)):
            bad = _run(op, m, n, dtype, "random", seed=31 * i + n, knobs=knobs)
            if bad:
                failures.append(f"{dtype} M={m}: {bad.describe()}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("n", (65536, 128256, 151936))
@pytest.mark.parametrize("op", ("rmsnorm_bwd", "layernorm_bwd"))
def test_norm_backward_overlapped_rows(op: str, n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop that sends tile i + 1's row sums before it waits on tile i's, whatever the
    tables choose: enough rows that each cluster reuses its four reduction stages several times
    (their barriers' second phase), M not a multiple of the grid, both widths."""
    from reference_kernels.tuning import rmsnorm_bwd

    monkeypatch.setattr(rmsnorm_bwd, "OVERLAP", ((None, 1),))
    failures = []
    for dtype in ("bfloat16", "float32"):
        for m in (1, 5, min(301, MAX_ELEMS // n) | 1):
            bad = _run(op, m, n, dtype, "random", seed=m + n, knobs={"row_loop": 2})
            if bad:
                failures.append(f"{dtype} M={m}: {bad.describe()}")
    assert not failures, "\n".join(failures)


SWEEP_TABLES = [
    # x and dy held in registers across the reduction, each buffer refilled once read: two
    # staged tiles (4096, also QuACK's shape), one (fp32 16384)
    ("SECOND_READ", "registers", 4096, {}),
    ("SECOND_READ", "registers", 4096, {"threads_per_row": 128, "num_threads": 128, "cluster_n": 1}),
    ("SECOND_READ", "registers", 16384, {}),
    # the CTA's warps folded before one warp a row sends: one tile's reduction at a time
    # (cluster 2), overlapped (cluster 8), and at 256K, where it lets the overlap in (bf16)
    ("CLUSTER_SEND", "cta", 16384, {}),
    ("CLUSTER_SEND", "cta", 65536, {}),
    ("CLUSTER_SEND", "cta", 262144, {}),
    ("CLUSTER_SEND", "warps", 262144, {}),  # (fp32's table folds there)
    # bf16 pairs widened by a shift and a mask (fp32 rows: unchanged), staged twice and held
    ("WIDEN_BF16", "bits", 4096, {}),
    ("WIDEN_BF16", "bits", 65536, {}),
    # a staged tile in chunks: two tiles staged (bf16 4096 and 262144; fp32 65536), one (fp32
    # 262144 and 16384)
    ("TILE_CHUNKS", 2, 262144, {}),
    ("TILE_CHUNKS", 4, 16384, {}),
    ("TILE_CHUNKS", 4, 4096, {}),
    ("TILE_CHUNKS", 4, 65536, {}),
    # the second pass in parts, each refilled once read, where one tile is staged: fp32 32768 and
    # 262144 (bf16 262144: two tiles staged, unchanged), fp32 16384 (several rows a CTA), and N
    # whose vectors do not split (one part)
    ("REFILL_PARTS", 2, 32768, {}),
    ("REFILL_PARTS", 8, 262144, {}),
    ("REFILL_PARTS", 4, 16384, {}),
    ("REFILL_PARTS", 8, 30001, {}),
    # two tiles staged where one was: fp32 32768 (the tables' choice, LayerNorm on a cluster of 8)
    # and bf16 32768
    ("STAGING_DEPTH", 2, 32768, {}),
]


@pytest.mark.parametrize(("table", "value", "n", "knobs"), SWEEP_TABLES, ids=lambda v: str(v))
@pytest.mark.parametrize("op", ("rmsnorm_bwd", "layernorm_bwd"))
def test_norm_backward_sweep_tables(
    op: str, table: str, value: str, n: int, knobs: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The norm backwards' modes that only a sweep turns on (rmsnorm_bwd.SECOND_READ,
    CLUSTER_SEND, WIDEN_BF16, TILE_CHUNKS, REFILL_PARTS and STAGING_DEPTH; both widths' tables
    where a table has a _32BIT one) against float64: M not a multiple of the grid, enough rows
    that a CTA loops over several tiles and each reduction stage is reused, both widths."""
    from reference_kernels.tuning import rmsnorm_bwd

    for name in (table, f"{table}_32BIT"):
        if hasattr(rmsnorm_bwd, name):
            monkeypatch.setattr(rmsnorm_bwd, name, ((None, value),))
    failures = []
    for dtype in ("bfloat16", "float32"):
        for m in (1, 5, min(2049, MAX_ELEMS // n) | 1):
            bad = _run(op, m, n, dtype, "random", seed=m + n, knobs={"row_loop": 2, **knobs})
            if bad:
                failures.append(f"{dtype} M={m}: {bad.describe()}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("op", ROW_OPS)
def test_public_function_and_torch_library(op: str) -> None:
    """The torch-facing function takes leading batch dims, and torch.compile can call it."""
    import torch

    from llmcompile import kernels

    spec = BUILTIN[op]
    gen = torch.Generator().manual_seed(3)
    inputs = spec.make_inputs(6, 1000, "bfloat16", gen, "random", "cuda")
    if inputs[0].dim() == 2 and op != "cross_entropy":
        inputs[0] = inputs[0].reshape(2, 3, 1000)
    refs = spec.run_reference([t.reshape(6, 1000) if t.dim() == 3 else t for t in inputs])
    tol = spec.tol("bfloat16")

    def check(outs) -> None:  # noqa: ANN001 - one tensor, or a list for several outputs
        outs = outs if isinstance(outs, (list, tuple)) else [outs]
        assert len(outs) == len(refs)
        for out, ref, desc in zip(outs, refs, spec.outputs):
            if desc.dims[:1] != ("M",):  # a sum over the rows keeps its own shape
                assert out.shape == ref.shape
            torch.testing.assert_close(out.double().reshape(ref.shape), ref, atol=tol.atol, rtol=tol.rtol)

    check(kernels.BY_NAME[op](*inputs))
    check(torch.compile(lambda *a: kernels.BY_NAME[op](*a), fullgraph=False)(*inputs))


def test_second_call_gives_new_results() -> None:
    """No state kept between calls: new inputs at the same addresses give new outputs."""
    import torch

    from llmcompile import kernels

    x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    a = kernels.softmax(x).clone()
    x.copy_(torch.randn_like(x))
    b = kernels.softmax(x)
    torch.testing.assert_close(b.double(), torch.softmax(x.double(), -1), atol=8e-3, rtol=2e-2)
    assert not torch.equal(a, b)


@pytest.mark.parametrize("n", [1024, 65536])
def test_back_to_back_calls_read_what_the_kernel_before_wrote(n: int) -> None:
    """Calls queued with no synchronisation, each reading what the kernel before it on the
    stream wrote (torch's, then ours twice), launched as programmatic dependents
    (reduce.DEPENDENT_LAUNCH). At 65536 the rows span a cluster of CTAs. With the kernels'
    wait taken out this still passed on the H100 (evals/results/row-forward, nowait.log):
    a grid that never releases its dependents early lets them launch only as it ends. The wait
    itself is checked in the PTX (test_reference_kernels_compile)."""
    import torch

    from llmcompile import kernels

    gen = torch.Generator("cuda").manual_seed(5)
    noise = torch.randn(5, (1 << 23) // n, n, device="cuda", generator=gen)
    z, ref = noise[0], noise[0].double()
    for k in range(1, len(noise)):
        # (log_softmax of a log_softmax is itself: the second call must read the first's rows,
        # and fresh noise makes every step's rows differ from any earlier tensor's)
        z = kernels.log_softmax(kernels.log_softmax(z)) + noise[k]
        ref = torch.log_softmax(ref, -1) + noise[k].double()
    torch.testing.assert_close(z.double(), ref, atol=2e-4, rtol=0)


def _ce_rows(n: int, ignore: int, m: int = 64) -> tuple:
    """bf16 logits on the GPU and targets with every fifth row at `ignore`, row 1 at N, row 2 below
    0 and row 3 at N - 1; which rows' targets lie in [0, N), and those rows' float64 losses."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(n)
    x = torch.randn(m, n, generator=gen).to(torch.bfloat16).cuda()
    target = torch.randint(0, n, (m,), generator=gen)
    target[::5] = ignore
    target[1], target[2], target[3] = n, -5, n - 1
    target = target.cuda()
    inside = (target >= 0) & (target < n)
    ref = F.cross_entropy(x.double()[inside], target[inside], ignore_index=ignore, reduction="none")
    return x, target, inside, ref


def _check_losses(loss, target, inside, ref, ignore: int) -> None:  # noqa: ANN001 - tensors
    import torch

    assert torch.isnan(loss[~inside]).all()
    torch.testing.assert_close(loss[inside].double(), ref, atol=1e-4, rtol=1e-4)
    assert (loss[target == ignore] == 0).all()


# the three ways to the target logit (TARGET_LOGIT), and at 512 the staged index (INDEX_LOAD)
@pytest.mark.parametrize("n", (256, 512, 1000, 65536))
def test_cross_entropy_targets_outside_and_ignored(n: int) -> None:
    """Out-of-range targets give NaN (torch raises), an in-range ignore_index gives 0, and
    every other row the exact loss, whether the logit is loaded, read from the staged row (its
    index loaded or staged beside the row) or taken from registers."""
    import torch

    from llmcompile import kernels

    m, ignore = 64, 3
    x, target, inside, ref = _ce_rows(n, ignore, m)
    loss = torch.full((m,), float("nan"), device="cuda")
    poisoned = torch.full((m,), -7.0, device="cuda")
    for out in (loss, poisoned):
        kernels.BY_NAME["cross_entropy"].compiled("bfloat16", n)(x, target, out, ignore)
    torch.cuda.synchronize()
    for out in (loss, poisoned):
        _check_losses(out, target, inside, ref, ignore)


@pytest.mark.parametrize("n", (256, 1000, 2048, 65536))  # the fused kernel's ways to the logit (FUSED_TARGET_LOGIT)
def test_fused_cross_entropy_targets_outside_and_ignored(n: int) -> None:
    """The fused kernel's loss as the plain one's (NaN outside [0, N), 0 at ignore_index), and its
    dlogits: 0 on ignored rows, softmax - onehot times the scale on the others (no onehot where the
    target is outside), whether the loss's logit is loaded, read from the staged row or taken from
    registers."""
    import torch
    import torch.nn.functional as F

    from llmcompile import kernels

    m, ignore, scale = 64, 3, 0.25
    x, target, inside, ref = _ce_rows(n, ignore, m)
    loss = torch.full((m,), -7.0, device="cuda")
    dx = torch.full((m, n), -7.0, dtype=torch.bfloat16, device="cuda")
    kernels.BY_NAME["cross_entropy_fused"].compiled("bfloat16", n)(
        x, target, torch.tensor([scale], device="cuda"), loss, dx, ignore
    )
    torch.cuda.synchronize()
    _check_losses(loss, target, inside, ref, ignore)
    kept = inside & (target != ignore)
    p = torch.softmax(x.double(), -1) * scale
    p[kept] -= F.one_hot(target[kept], n).double() * scale
    p[target == ignore] = 0.0
    torch.testing.assert_close(dx.double(), p, atol=2e-3, rtol=2e-2)


@pytest.mark.parametrize("parts", (PARTS, 3))
@pytest.mark.parametrize(("n", "dtype"), ((512, "bfloat16"), (5001, "float32"), (65536, "bfloat16")))
def test_cross_entropy_total_from_partials_or_rows(n: int, dtype: str, parts: int) -> None:
    """The loss's total from the row kernel's CTA partials, and, where there are more CTAs than
    the workspace holds (3 here, 2^18 in use), from the rows themselves: sum, mean over the kept
    rows and 1/kept as float64's, ignored and outside rows among them, the same bits on a second
    run (a fixed order, no atomics)."""
    import torch
    import torch.nn.functional as F

    from llmcompile.runtime.compiled import compiler_of
    from reference_kernels.cross_entropy_total import WORKSPACE, CrossEntropyTotal

    spec = BUILTIN["cross_entropy_total"]
    fn = compiler_of(spec, CrossEntropyTotal(parts=parts), WORKSPACE)(dtype, n)
    m = 1000
    gen = torch.Generator().manual_seed(n + parts)
    x = torch.randn(m, n, generator=gen).to(getattr(torch, dtype)).cuda()
    target = torch.randint(0, n, (m,), generator=gen).cuda()
    target[::7] = -100
    runs = []
    for _ in range(2):
        outs = spec.alloc_outputs(m, n, dtype, "cuda")
        poison(outs)
        fn(x, target, *outs, -100)
        runs.append(outs)
    torch.cuda.synchronize()
    loss, total, mean, inv = runs[0]
    kept = int((target != -100).sum())
    want = F.cross_entropy(x.double(), target, reduction="sum")
    torch.testing.assert_close(total.double()[0], want, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(mean.double()[0], want / kept, rtol=1e-5, atol=1e-5)
    assert inv.item() == pytest.approx(1.0 / kept, rel=1e-6)
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1:], runs[1][1:]))
    target[5] = n  # outside [0, N): NaN, as the row's loss
    outs = spec.alloc_outputs(m, n, dtype, "cuda")
    fn(x, target, *outs, -100)
    assert outs[1].isnan().all() and outs[2].isnan().all()


@pytest.mark.parametrize("op", ("cross_entropy_total", "cross_entropy_fused_total"))
@pytest.mark.parametrize(("n", "dtype"), ((512, "bfloat16"), (1024, "bfloat16"), (1000, "float32"), (4096, "bfloat16")))
def test_cross_entropy_total_in_one_cta(op: str, n: int, dtype: str) -> None:
    """A small input's total in one launch (one CTA writes it, `total_in_cta`), and just past it
    the two launches: every output against float64 by the judge's rule, at M = 1, the most rows
    the one CTA takes, and one more; ignored rows and a row outside [0, N) among them; a batch of
    ignored rows has a mean of 0 and 1/kept of 1."""
    import importlib

    import torch

    from llmcompile.runtime.compiled import compiler_of
    from reference_kernels.cross_entropy_total import WORKSPACE

    spec = BUILTIN[op]
    op_class = type(importlib.import_module(f"reference_kernels.{op}").launch)
    _, rows = op_class().one_cta(n, torch.finfo(getattr(torch, dtype)).bits)
    assert rows >= 1
    fn = compiler_of(spec, op_class(), WORKSPACE)(dtype, n)
    gen = torch.Generator().manual_seed(n)
    for m in sorted({1, rows, rows + 1}):
        x = torch.randn(m, n, generator=gen).to(getattr(torch, dtype)).cuda()
        target = torch.randint(0, n, (m,), generator=gen).cuda()
        target[::3] = -100
        outs = spec.alloc_outputs(m, n, dtype, "cuda")
        poison(outs)
        fn(x, target, *outs, -100)
        torch.cuda.synchronize()
        assert compare(spec, dtype, [x, target], outs, {"ignore_index": -100}) is None, (m, rows)
        target.fill_(-100)
        poison(outs)
        fn(x, target, *outs, -100)
        assert [o.item() for o in outs[-3:]] == [0.0, 0.0, 1.0], (m, rows)
        target[-1] = n
        fn(x, target, *outs, -100)
        assert outs[-3].isnan().item() and outs[-2].isnan().item(), (m, rows)


# (M, N): partial query and key tiles (129, 1000, 5001), one tile, many heads
ATTENTION_SHAPES = ((5, 129), (3, 1000), (2, 5001), (64, 128), (16, 2048))


@pytest.mark.parametrize("dtype", ("bfloat16", "float16"))
@pytest.mark.parametrize("op", ATTENTION)
def test_attention_matches_float64_reference(op: str, dtype: str) -> None:
    failures = []
    for i, (m, n) in enumerate(ATTENTION_SHAPES):
        for case in BUILTIN[op].cases:
            bad = _run(op, m, n, dtype, case, seed=11 * i + n)
            if bad:
                failures.append(f"M={m} N={n} {case}: {bad.describe()}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("op", ["attention", "attention_causal"])
def test_attention_public_function(op: str) -> None:
    """kernels.attention(q, k, v) on (heads, seq, dim) tensors, eager and under torch.compile."""
    import torch

    from llmcompile import kernels

    spec = BUILTIN[op]
    inputs = spec.make_inputs(4, 777, "bfloat16", torch.Generator().manual_seed(5), "random", "cuda")
    refs = spec.run_reference(inputs)
    tol = spec.tol("bfloat16")
    fn = kernels.BY_NAME[op]
    # the first call, the lean one on shapes it has run, a strided q (copied by the checked path)
    strided = (inputs[0].transpose(1, 2).contiguous().transpose(1, 2), *inputs[1:])
    for outs in (fn(*inputs), fn(*inputs), fn(*strided), torch.compile(lambda *a: fn(*a))(*inputs)):
        for out, ref in zip(outs, refs):
            torch.testing.assert_close(out.double(), ref, atol=tol.atol, rtol=tol.rtol)
    with pytest.raises(OpError, match="must be"):  # a wrong shape: still the checked path's word
        fn(inputs[0][:, :-1], *inputs[1:])


def _attention_failures(entry, op: str, dtype: str, shapes=ATTENTION_SHAPES) -> list[str]:
    """`entry` (a kernel object, not the op's reference) against float64 on poisoned outputs."""
    import torch

    from llmcompile.specs import contract

    spec = BUILTIN[op]
    failures = []
    for i, (m, n) in enumerate(shapes):
        fn = contract.compile_entry(entry, spec, dtype, n)
        for case in spec.cases:
            inputs = spec.make_inputs(m, n, dtype, torch.Generator().manual_seed(13 * i + n), case, "cuda")
            outs = spec.alloc_outputs(m, n, dtype, "cuda")
            poison(outs)
            fn(*inputs, *outs, *spec.scalars.values())
            torch.cuda.synchronize()
            bad = compare(spec, dtype, inputs, outs)
            if bad:
                failures.append(f"M={m} N={n} {case}: {bad.describe()}")
    return failures


@pytest.mark.parametrize("dtype", ("bfloat16", "float16"))
@pytest.mark.parametrize("op", ("attention", "attention_causal", "attention_causal_d64"))
def test_ampere_attention_matches_float64_reference(op: str, dtype: str) -> None:
    """The Ampere kernel (reference_kernels/attention_sm80.py, an offline candidate) against
    float64, on the same shapes as the reference attention."""
    from reference_kernels.attention_sm80 import AttentionSm80

    failures = _attention_failures(AttentionSm80(causal="causal" in op), op, dtype)
    assert not failures, "\n".join(failures)


# head groups with a partial last one: 7 heads at N = 3000 (a group of 32 when L2 sets it), 40
# at N = 4096 (groups of 16 or 8)
KNOB_SHAPES = (*ATTENTION_SHAPES, (7, 3000), (40, 4096))


@pytest.mark.parametrize("knobs", ATTENTION_KNOBS)
@pytest.mark.parametrize("op", ("attention", "attention_causal", "attention_causal_d64"))
def test_attention_search_knobs_match_float64_reference(op: str, knobs: str) -> None:
    """Every AttentionKnobs set the offline search offers (launch orders, tile sizes) against
    float64, bf16."""
    from reference_kernels.attention import Attention, AttentionKnobs

    entry = Attention(causal="causal" in op, knobs=AttentionKnobs(**knob_fields(knobs)))
    failures = _attention_failures(entry, op, "bfloat16", KNOB_SHAPES)
    assert not failures, "\n".join(failures)


# (M, N, D): one query tile, three, 97's own shape (N = 512, D = 1024), an odd head count
TF32_ATTENTION_SHAPES = ((3, 64, 128), (5, 192, 384), (2, 512, 1024), (7, 448, 256))
# max |error| / max |reference| allowed: TF32 operands (rounded to nearest, 2^-11) through a
# dot product of D terms and a softmax; `peaked` logits (std ~8) magnify the scores' rounding
TF32_ATTENTION_TOL = {"rand": 2e-4, "randn": 2e-3, "peaked": 2e-2}


@pytest.mark.parametrize("warps_m", (1, 2, 4))
@pytest.mark.parametrize("case", tuple(TF32_ATTENTION_TOL))
def test_fp32_attention_matches_float64_reference(case: str, warps_m: int) -> None:
    """reference_kernels/attention_tf32.py (97_ScaledDotProductAttention's kernel) against
    float64 softmax attention, outputs poisoned first: uniform inputs as 97 makes them, normal
    ones, and logits scaled up to a near one-hot softmax; each warp layout."""
    import math

    import torch
    import torch.nn.functional as F

    from evals.scripts.attention_fp32 import signature
    from llmcompile.specs import contract
    from reference_kernels.attention_tf32 import AttentionTf32

    failures = []
    for i, (m, n, d) in enumerate(TF32_ATTENTION_SHAPES):
        gen = torch.Generator().manual_seed(17 * i + n)
        make = torch.rand if case == "rand" else torch.randn
        q, k, v = (make((m, n, d), generator=gen).cuda() for _ in range(3))
        scale = (8.0 if case == "peaked" else 1.0) / math.sqrt(d)
        fn = contract.compile_entry(AttentionTf32(warps_m), signature(d), "float32", n)
        o = torch.empty_like(q)
        poison([o])
        fn(q, k, v, o, scale)
        torch.cuda.synchronize()
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), scale=scale)
        err = (o.double() - ref).abs().max().item() / ref.abs().max().item()
        if not err <= TF32_ATTENTION_TOL[case]:  # NaN (an unwritten element) fails too
            failures.append(f"M={m} N={n} D={d}: max error {err:.3g} of the largest output")
    assert not failures, "\n".join(failures)
