"""The grouped-normalization template (reference_kernels/norm.py): its on-chip path (which groups
take it, that it compiles for sm_90a with its barrier, and on the GPU that it matches a float64
LayerNorm / GroupNorm, gives the same bits every run, and falls back where the workspace is
short), and short groups' values, a thread a group."""

from __future__ import annotations

from typing import Any

import pytest

from reference_kernels import norm as N

EPS = 1e-5


def test_on_chip_split_of_kernelbench_groups() -> None:
    knobs = N.NormKnobs()
    # GroupNorm 35: 8 channels x 512 x 512 fp32 a group: 86 chunks of 95 KB, 264 CTAs resident
    assert N.resident_split(knobs, 32, 8 * 512 * 512, 4) == (86, 24388, 264)
    # LayerNorm 40 over (64, 256, 256): 171 chunks, still under the 264 CTAs resident at once
    k, per, grid = N.resident_split(knobs, 32, 64 * 256 * 256, 4)
    assert (k, grid) == (171, 264) and k * per >= 64 * 256 * 256 and per * 4 <= knobs.resident_bytes
    # 16-bit groups: twice the elements a chunk
    assert N.resident_split(knobs, 16, 64 * 256 * 256, 8)[0] == 86
    # a group of more chunks than CTAs resident at once never takes it (its barrier would not open)
    assert N.resident_split(knobs, 32, 264 * 24576 + 4, 4) == (0, 0, 0)
    assert N.resident_split(N.NormKnobs(resident_bytes=0), 32, 1 << 20, 4) == (0, 0, 0)
    # an odd group: scalar vectors, the chunks still cover it
    k, per, _ = N.resident_split(knobs, 32, 50001, 1)
    assert k == 3 and k * per >= 50001


def _norm(seg_len: int, gpi: int, param_mul: int, param_div: int, knobs: N.NormKnobs) -> Any:
    import cutlass.cute as cute

    from reference_kernels import strided as S

    def apply(x, s, p):
        return (x - s[0]) * s[1] * p[0] + p[1]

    norm = N.GroupedNorm(
        N.shifted_moments,
        S.add,
        (0.0, 0.0),
        N.mean_rstd(EPS),
        apply,
        "groups",
        gpi,
        seg_len,
        param_mul,
        param_div,
        knobs,
    )

    @cute.jit
    def launch(x, w, b, o, ws, stream):  # no annotations: this module's are strings cute.jit cannot resolve
        norm(x, (w, b), o, ws, stream)

    return launch


def _compile(launch: Any, width: int, params: int, workspace: int, options: str = "") -> Any:
    import cutlass
    import cutlass.cute as cute

    from llmcompile.specs import contract

    contract.ensure_arch()

    def fake(shape: tuple) -> Any:
        order = tuple(reversed(range(len(shape))))
        return cute.runtime.make_fake_compact_tensor(cutlass.Float32, shape, stride_order=order, assumed_align=16)

    x = fake((cute.sym_int(), width))
    args = [x, fake((params,)), fake((params,)), fake((cute.sym_int(), width)), fake((workspace,))]
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return cute.compile(launch, *args, stream, options=f"--enable-tvm-ffi {options}".strip())


def test_on_chip_path_compiles_with_its_barrier(tmp_path) -> None:
    """The PTX holds the arrival (a release), the wait (acquire loads) and the ticket counter."""
    seg = 4 * 24576
    _compile(_norm(seg, 1, 1, seg // 4, N.NormKnobs()), seg, 4, N.WORKSPACE, f"--keep-ptx --dump-dir={tmp_path}")
    ptx = "\n".join(p.read_text() for p in tmp_path.rglob("*.ptx"))
    assert "kernel_cutlass_resident" in ptx and "kernel_cutlass_clear" in ptx
    assert "atom.global.release.add" in ptx and "ld.acquire.gpu" in ptx
    assert "kernel_cutlass_partials" in ptx  # the split path, for an M whose counters do not fit


def test_groups_as_rows_launch_dependent_and_wait_first(tmp_path) -> None:
    """Groups taken as rows run the row template's kernel, launched as a programmatic
    dependent (reduce.DEPENDENT_LAUNCH): it waits for the previous grid before it reads."""
    from tests.test_reference_kernels_compile import assert_waits_before_global_access

    seg = 65536
    _compile(_norm(seg, 1, 0, seg, N.NormKnobs()), seg, 16, N.WORKSPACE, f"--keep-ptx --dump-dir={tmp_path}")
    ptx = "\n".join(p.read_text() for p in tmp_path.rglob("*.ptx"))
    (body,) = ptx.split(".entry ")[1:]
    assert body.startswith("kernel_cutlass_rows")
    assert_waits_before_global_access(body)


def test_a_weight_per_element_takes_the_row_path_or_the_split_path(tmp_path) -> None:
    """A LayerNorm's weight over every normalized element: rows up to `row_max` hold it in
    registers beside the row (one read of x, the weight from L2, as the reference LayerNorm);
    longer groups would read as many parameters as elements again on the on-chip path, so they
    take the split path."""
    for seg, kernel in ((4 * 24576, "kernel_cutlass_rows"), (16 * 24576, "kernel_cutlass_partials")):
        d = tmp_path / str(seg)
        d.mkdir()
        _compile(_norm(seg, 1, 0, 1, N.NormKnobs()), seg, seg, N.WORKSPACE, f"--keep-ptx --dump-dir={d}")
        ptx = "\n".join(p.read_text() for p in d.rglob("*.ptx"))
        assert kernel in ptx and "kernel_cutlass_resident" not in ptx and "kernel_cutlass_fused" not in ptx


def _reference(x: Any, w: Any, b: Any, gpi: int, param_div: int) -> Any:
    """float64 GroupNorm of (M, gpi * L) rows: weight and bias at element e are w[e // param_div]."""
    import torch

    m = x.shape[0]
    g = x.double().reshape(m, gpi, -1)
    mean = g.mean(-1, keepdim=True)
    var = g.var(-1, unbiased=False, keepdim=True)
    y = ((g - mean) / torch.sqrt(var + EPS)).reshape(m, -1)
    idx = torch.arange(x.shape[1], device=x.device) // param_div
    return y * w.double()[idx] + b.double()[idx]


CASES = [
    # (L a group, groups an item, param_mul, param_div, M): 4 channels of an odd length (a
    # parameter per element read), the last chunk short, more chunks than CTAs; a GroupNorm with
    # a weight per channel; an odd group (scalar loads)
    (3 * 24576 + 100, 1, 4, 18457, (1, 7, 300)),
    (2 * 40000, 4, 2, 40000, (1, 5)),
    (50001, 1, 7, 7143, (3,)),
    # groups of 200 chunks (of 264 CTAs resident): a CTA's chunks often fall in one group, where
    # taking the next chunk before the wait deadlocked
    (200 * 24576, 1, 8, 200 * 24576 // 8, (1, 4)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=["channels", "groupnorm", "odd", "long"])
def test_on_chip_path_matches_float64_and_repeats_its_bits(case: tuple) -> None:
    import torch

    seg, gpi, mul, div, ms = case
    width = seg * gpi
    nparams = width if mul == 0 else width // div
    fn = _compile(_norm(seg, gpi, mul, div, N.NormKnobs()), width, nparams, N.WORKSPACE)
    gen = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(nparams, device="cuda", generator=gen)
    b = torch.randn(nparams, device="cuda", generator=gen)
    k, _, grid = N.resident_split(N.NormKnobs(), 32, seg, 1 if seg % 4 else 4)
    for m in ms:
        x = torch.randn(m, width, device="cuda", generator=gen) * 3 + 5  # a mean far from 0
        ws = torch.full((N.WORKSPACE,), float("nan"), device="cuda")  # undefined on entry
        outs = []
        for _ in range(2):
            o = torch.full_like(x, float("nan"))
            fn(x, w, b, o, ws)
            outs.append(o)
        torch.cuda.synchronize()
        want = _reference(x, w, b, gpi, div)
        torch.testing.assert_close(outs[0].double(), want, rtol=1e-4, atol=1e-4)
        assert torch.equal(outs[0].view(torch.int32), outs[1].view(torch.int32)), f"M={m}: bits differ"
        # the ticket counter: one ticket a chunk, then one failed take a CTA
        tickets = m * gpi * k
        at = tickets * N.MAX_ARITY
        assert int(ws[at : at + 1].view(torch.int32)) == tickets + min(tickets, grid)


@pytest.mark.gpu
def test_on_chip_path_falls_back_where_the_workspace_is_short(monkeypatch) -> None:
    """An M whose partials and counters the workspace cannot hold takes the split path, in the
    same compiled kernel."""
    import torch

    seg = 2 * 24576
    # k = 2: a group's partials and its arrival counter, then the ticket counter: 12 groups fit
    monkeypatch.setattr(N, "WORKSPACE", 12 * (2 * N.MAX_ARITY + 1) + 1)
    fn = _compile(_norm(seg, 1, 1, seg // 2, N.NormKnobs()), seg, 2, 1 << 16)
    gen = torch.Generator(device="cuda").manual_seed(1)
    w = torch.randn(2, device="cuda", generator=gen)
    b = torch.randn(2, device="cuda", generator=gen)
    for m, resident in ((12, True), (13, False)):
        x = torch.randn(m, seg, device="cuda", generator=gen)
        ws = torch.full((1 << 16,), -1.0, device="cuda")
        o = torch.full_like(x, float("nan"))
        fn(x, w, b, o, ws)
        torch.cuda.synchronize()
        torch.testing.assert_close(o.double(), _reference(x, w, b, 1, seg // 2), rtol=1e-4, atol=1e-4)
        counter = int(ws[m * 2 * N.MAX_ARITY : m * 2 * N.MAX_ARITY + 1].view(torch.int32))
        assert (counter == m * 2 + m * 2) == resident, (m, counter)


def test_a_value_a_group_takes_its_threads_by_the_groups_bytes() -> None:
    """A thread a group up to T.PACKED_BYTES; past it, a CTA a group of T.FUSED_THREADS' threads,
    a Chan merge (a var) too, but 256 for a rewrite, as before."""
    from reference_kernels.tuning import norm as T

    k = N.NormKnobs()
    short = N.resolve_tiling(k, 32, T.PACKED_BYTES // 4, "groups", values=True)
    assert short.packed and short.num_threads == k.num_threads
    assert not N.resolve_tiling(k, 32, T.PACKED_BYTES // 4 + 4, "groups", values=True).packed
    assert N.resolve_tiling(k, 32, 1024, "groups", values=True).num_threads == N.pick(T.FUSED_THREADS, 4096) < 256
    assert N.resolve_tiling(k, 32, 1024, "groups").num_threads == 256  # a rewrite
    assert not N.resolve_tiling(k, 32, 16, "groups").packed
    assert not N.resolve_tiling(N.NormKnobs(packed_bytes=0), 32, 16, "groups", values=True).packed
    assert N.resolve_tiling(N.NormKnobs(fused_threads=96), 32, 1024, "groups", values=True).num_threads == 96


# a value of each short row, as users write them: (forward, the input's shape)
SHORT = [
    ("torch.logsumexp(x, -1)", "(8192, 16)"),
    ("torch.argmax(x, -1)", "(8192, 8)"),  # the index reaches the prologue
    ("torch.max(x, -1)", "(8192, 64)"),  # two outputs
    ("x.var(-1)", "(4096, 2, 32)"),  # a Chan merge; rows of the last dim of a 3-D input
    ("torch.logsumexp(x, -1).mean()", "(8192, 4)"),  # the chain's rows
]


def _entry_names(src, dtype: str, tmp_path) -> list[str]:
    """The kernels the matcher's kernel for the problem file `src` launches, by their PTX names."""
    from llmcompile.agent import patterns
    from llmcompile.specs import contract, get_op

    spec = get_op(str(src))
    m = patterns.match(spec)
    path = tmp_path / "k.py"
    path.write_text(m.source)
    mod = contract.load_module(path)
    out = tmp_path / "ptx"
    out.mkdir()
    options = f"--keep-ptx --dump-dir={out}"
    n = spec.fixed_shapes[0][1]
    assert contract.compile_entry(
        contract.entry_of(mod), spec, dtype, n, options=options, workspace=contract.workspace_of(mod)
    )
    ptx = "\n".join(f.read_text() for f in out.rglob("*.ptx"))
    return [body.split("(", 1)[0] for body in ptx.split(".entry ")[1:]]


@pytest.mark.parametrize(("forward", "shape"), [*SHORT, ("torch.logsumexp(x, -1)", "(8192, 1024)")])
def test_short_groups_take_a_thread_each(forward: str, shape: str, tmp_path) -> None:
    """A value of each group of up to T.PACKED_BYTES: one thread a group (`packed`), not a CTA of
    256 threads for a few elements (0.8% of copy at 16 fp32 a row, H200)."""
    from reference_kernels.tuning import norm as T
    from tests.level1 import problem_file

    names = _entry_names(problem_file(tmp_path, "short", forward, shape), "bfloat16", tmp_path)
    row = int(shape.rsplit(", ", 1)[1].rstrip(")"))
    packed = [n for n in names if "_packed_" in n]
    short = row * 2 <= T.PACKED_BYTES  # (bf16)
    assert bool(packed) == short, names  # (the chain launches its rows twice)
    assert any("_fused_" in n for n in names) == (not short), names


@pytest.mark.gpu
@pytest.mark.parametrize(("forward", "shape"), SHORT)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_short_groups_are_right(forward: str, shape: str, dtype: str, tmp_path) -> None:
    from tests.level1 import problem_file, right_on_gpu

    typed = shape.replace(")", f", dtype=torch.{dtype})")
    right_on_gpu(problem_file(tmp_path, "short", forward, typed), dtype, tmp_path, 43)
