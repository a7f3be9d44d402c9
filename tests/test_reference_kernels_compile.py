"""CI, no GPU: every reference kernel compiles for sm_90a across the dtype x N grid, without
more than a token spill (layernorm at long odd N keeps x, weight and bias in registers and
spills a few bytes there; anything larger means a heuristic table is wrong)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import cutlass.cute as cute
import pytest
from cutlass import Float32, Int32

from llmcompile.agent.offline import ATTENTION_KNOBS, knob_fields
from llmcompile.specs import BUILTIN, contract
from reference_kernels.tuning import rows

NS = (256, 1024, 4096, 5000, 5001, 16384, 65536, 128256, 151936, 262144)
DTYPES = ("float32", "bfloat16", "float16")
MAX_SPILL_BYTES = 64  # layernorm fp32 N=151936 spills 52 B at its 128-register cap (512 threads)
# The norms' backward past 64K (512-thread CTAs, 128 registers): two fp32 column sums and the
# row's fp32 temporaries. LayerNorm's spills 178 B at bf16 N=151936 and 116 B at fp32 (w read
# from L2 twice a tile there); 204 and 920 B before its second pass took two FMAs a value. Their
# one-value variants (*_bwd_scalar: dy read as one value) are the same kernel and spill the same.
MAX_SPILL_BYTES_BWD_LONG = 256

# ptxas's warnings on warpgroup MMAs (C75xx: "Potential Performance Loss", serialised or waited on)
WGMMA_LOSS = re.compile(r"\(C75\d\d\)|Potential Performance Loss")


def _spill_stores(text: str) -> list[int]:
    """Each kernel's spill stores in bytes, from ptxas' remarks."""
    return [int(s) for s in re.findall(r"(\d+) bytes spill stores", text)]


def spill_budget(op: str, n: int) -> int:
    if op.removesuffix("_scalar") not in ("rmsnorm_bwd", "layernorm_bwd") or n < 65536:
        return MAX_SPILL_BYTES
    return MAX_SPILL_BYTES_BWD_LONG


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", sorted(BUILTIN))
def test_compiles_for_sm90a(op: str, dtype: str, capfd: pytest.CaptureFixture[str]) -> None:
    spec = BUILTIN[op]
    if dtype not in spec.dtypes:
        pytest.skip(f"{op} takes {', '.join(spec.dtypes)}")
    mod = importlib.import_module(f"reference_kernels.{spec.reference_module}")
    entry, workspace = contract.entry_of(mod), contract.workspace_of(mod)
    # (a fixed-layout op, attention, at its own sequence lengths and held-out ones)
    ns = sorted({n for _, n in (*spec.shapes(), *spec.extra_verify)}) if spec.fixed_shapes else NS
    for n in ns:
        fn = contract.compile_entry(entry, spec, dtype, n, options="remarks{ptx}", workspace=workspace)
        assert fn is not None
        report = capfd.readouterr()
        text = report.out + report.err
        spills = _spill_stores(text)
        assert spills and max(spills) <= spill_budget(op, n), (
            f"{op} {dtype} N={n}: spills or no ptxas report\n{text[-2000:]}"
        )
        # a warpgroup MMA whose registers were written after its fence (ptxas adds a wait, C7519),
        # or too few registers to pipeline them (ptxas serialises them, C7512)
        assert not WGMMA_LOSS.search(text), f"{op} {dtype} N={n}: WGMMA serialised\n{text[-2000:]}"


@pytest.mark.parametrize("knobs", ATTENTION_KNOBS)
@pytest.mark.parametrize("op", ["attention", "attention_causal_d64"])
def test_every_attention_tile_size_compiles_clean(op: str, knobs: str, capfd: pytest.CaptureFixture[str]) -> None:
    """The offline search's tile sizes for attention build at a partial tile without spills
    and without ptxas-injected warpgroup waits."""
    from reference_kernels.attention import Attention, AttentionKnobs

    entry = Attention(causal="causal" in op, knobs=AttentionKnobs(**knob_fields(knobs)))
    assert contract.compile_entry(entry, BUILTIN[op], "bfloat16", 1000, options="remarks{ptx}") is not None
    text = "".join(capfd.readouterr())
    spills = _spill_stores(text)
    assert spills and max(spills) == 0 and not WGMMA_LOSS.search(text), text[-1500:]


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "rmsnorm", "layernorm", "cross_entropy"])
def test_row_ops_compile_for_strided_rows(op: str, capfd: pytest.CaptureFixture[str]) -> None:
    """The variant a slice x[:, :N] of wider rows calls (`strided_rows`: x's row stride known at
    run time, a multiple of 16 bytes) builds in both widths, short rows and long, without spills."""
    spec = BUILTIN[op]
    mod = importlib.import_module(f"reference_kernels.{spec.reference_module}")
    entry, ws = contract.entry_of(mod), contract.workspace_of(mod)
    for dtype in ("bfloat16", "float32"):
        for n in (1024, 65536):
            fn = contract.compile_entry(entry, spec, dtype, n, options="remarks{ptx}", workspace=ws, strided_rows=True)
            text = "".join(capfd.readouterr())
            spills = _spill_stores(text)
            assert fn is not None and spills and max(spills) <= MAX_SPILL_BYTES, f"{op} {dtype} N={n}\n{text[-1500:]}"
    with pytest.raises(ValueError, match="rows"):  # attention's first tensor is not rows
        contract.fake_args(BUILTIN["attention"], "bfloat16", 1024, strided_rows=True)


@pytest.mark.parametrize("op", ["cross_entropy_total", "cross_entropy_fused_total"])
def test_the_loss_total_is_one_launch_for_a_small_input(op: str, tmp_path: Path) -> None:
    """The total's launcher holds both paths, chosen by M when called: one CTA of T.ONE_CTA's
    threads (its block size the kernel's reqntid, which bounds its registers) for up to T.ONE_CTA's
    bytes of logits, else the rows kernel and the finish; a row past those bytes, or too long for
    the CTA's registers, has no one-CTA kernel at all."""
    from reference_kernels.tuning import cross_entropy as T

    spec = BUILTIN[op]
    mod = importlib.import_module(f"reference_kernels.{op}")
    threads, most = T.ONE_CTA
    assert type(mod.launch)().one_cta(1024, 16)[1] == min(most // 2048, threads // 32)
    assert type(mod.launch)(one_cta_limits=(0, 0)).one_cta(1024, 16) == (None, 0)
    for n, kernels in ((1024, 3), (65536, 2)):
        out = tmp_path / str(n)
        out.mkdir()
        entry, ws = contract.entry_of(mod), contract.workspace_of(mod)
        contract.compile_entry(entry, spec, "bfloat16", n, options=f"--keep-ptx --dump-dir={out}", workspace=ws)
        ptx = "\n".join(p.read_text() for p in out.rglob("*.ptx"))
        assert len(re.findall(r"\.entry ", ptx)) == kernels, n
        assert (f".reqntid {threads}" in ptx) == (kernels == 3), n


@pytest.mark.parametrize("op", ["attention", "attention_causal_d64"])
def test_attention_compiles_for_a_strided_v(op: str, capfd: pytest.CaptureFixture[str]) -> None:
    """The variant the attention node calls for SDPA's 4-D tensors (`strided_v`: v and o of (B, H,
    N, D) at run-time strides, v read through a 4-D TMA view, o stored through one) builds clean, as
    the dense one does; the flag wants an attention's (M, N, D) third and fourth tensors."""
    spec = BUILTIN[op]
    entry = contract.entry_of(importlib.import_module(f"reference_kernels.{spec.reference_module}"))
    assert getattr(entry, "takes_strided_v", False)
    assert contract.compile_entry(entry, spec, "bfloat16", 1000, options="remarks{ptx}", strided_v=True) is not None
    text = "".join(capfd.readouterr())
    spills = _spill_stores(text)
    assert spills and max(spills) == 0 and not WGMMA_LOSS.search(text), text[-1500:]
    with pytest.raises(ValueError, match="attention's third and fourth tensors"):
        contract.fake_args(BUILTIN["softmax"], "bfloat16", 1024, strided_v=True)


@pytest.mark.parametrize("mode", ["early", "late", "smem"])
@pytest.mark.parametrize("op", ["layernorm", "rmsnorm"])
def test_every_column_mode_compiles(op: str, mode: str, capfd: pytest.CaptureFixture[str]) -> None:
    """RowKnobs.columns is a search knob: each mode must build, with 128-bit vectors (smem
    stages through cp.async) and with N odd (smem falls back to late), in both widths."""
    from reference_kernels.reduce import RowKnobs

    spec = BUILTIN[op]
    mod = importlib.import_module(f"reference_kernels.{spec.reference_module}")
    entry = type(mod.launch)(RowKnobs(columns=mode))
    for dtype in ("bfloat16", "float32"):
        for n in (5001, 131072):
            assert contract.compile_entry(entry, spec, dtype, n, options="remarks{ptx}") is not None
            text = "".join(capfd.readouterr())
            spills = _spill_stores(text)
            assert spills and max(spills) <= MAX_SPILL_BYTES, f"{op} {mode} {dtype} N={n}\n{text[-1500:]}"


@pytest.mark.parametrize(
    "knobs",
    [
        {"row_loop": 2, "stage_smem": False, "prefetch_registers": False},
        {"row_loop": 4, "stage_smem": True},
        {"row_loop": 2, "stage_smem": False, "prefetch_registers": True},
    ],
    ids=str,
)
@pytest.mark.parametrize("op", ["layernorm", "rmsnorm"])
def test_row_loop_compiles(op: str, knobs: dict, capfd: pytest.CaptureFixture[str]) -> None:
    """RowKnobs.row_loop: a CTA going through several row tiles (two stages of reduction
    buffers and mbarriers, a staged row's or a register-prefetched row's successor in
    flight) builds in every column mode."""
    from reference_kernels.reduce import RowKnobs

    spec = BUILTIN[op]
    mod = importlib.import_module(f"reference_kernels.{spec.reference_module}")
    for mode in ("early", "smem"):
        entry = type(mod.launch)(RowKnobs(columns=mode, **knobs))
        for dtype, n in (("bfloat16", 65536), ("bfloat16", 262144), ("float32", 5001)):
            assert contract.compile_entry(entry, spec, dtype, n, options="remarks{ptx}") is not None
            text = "".join(capfd.readouterr())
            spills = _spill_stores(text)
            assert spills and max(spills) <= MAX_SPILL_BYTES, f"{op} {knobs} {mode} {dtype} N={n}\n{text[-1500:]}"


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("op", ["layernorm_bwd", "rmsnorm_bwd"])
def test_norm_backward_longest_rows_keep_their_sums_in_registers(
    op: str, dtype: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """At N = 262144 a thread holds 32 values of the row and one or two fp32 column sums of 32:
    the tile's arithmetic leaves them in registers (fp32 LayerNorm spilled 156 B, at 64% of
    copy on the H100, when dx took seven operations a value and the row-in-range branch made
    x, dy and xhat twice; 87% with neither)."""
    spec = BUILTIN[op]
    mod = importlib.import_module(f"reference_kernels.{spec.reference_module}")
    entry = contract.entry_of(mod)
    fn = contract.compile_entry(
        entry, spec, dtype, 262144, options="remarks{ptx}", workspace=contract.workspace_of(mod)
    )
    assert fn is not None
    text = "".join(capfd.readouterr())
    spills = _spill_stores(text)
    assert spills and max(spills) <= 8, f"{op} {dtype}\n{text[-1500:]}"


@pytest.mark.parametrize("op", ["layernorm_bwd", "rmsnorm_bwd"])
def test_norm_backward_reads_w_late_at_odd_n(op: str) -> None:
    """w asked for in shared memory (columns "smem") at an odd 16-bit N would move 2-byte vectors,
    which cp.async cannot (the H100's row-loop tests caught the build failing): it is loaded from L2
    each tile instead, and the kernel builds."""
    from reference_kernels.reduce import RowKnobs

    spec = BUILTIN[op]
    mod = importlib.import_module(f"reference_kernels.{spec.reference_module}")
    entry = type(mod.launch)(RowKnobs(row_loop=4, stage_smem=True, columns="smem"))
    widths = (16, 16, 16)
    _, weight_in, _ = entry.plan(entry.knobs, 5001, widths, 16)
    assert weight_in == "late"
    assert entry.plan(entry.knobs, 5000, widths, 16)[1] == "smem"
    assert contract.compile_entry(entry, spec, "bfloat16", 5001, workspace=contract.workspace_of(mod)) is not None


def test_too_much_shared_memory_is_a_clear_error() -> None:
    """Knobs whose buffers pass what a CTA may have (half an fp32 row staged beside weight
    and bias in shared memory) fail when compiled, naming the limit, not on the GPU."""
    from llmcompile.kernels import reference_function
    from reference_kernels.reduce import RowKnobs

    fn = reference_function("layernorm", RowKnobs(cluster_n=2, stage_smem=True, columns="smem"))
    assert fn.compiled("bfloat16", 65536) is not None
    with pytest.raises(ValueError, match=r"\d{6} B of shared memory per CTA; sm_90 allows at most 232448 B"):
        fn.compiled("float32", 65536)


def test_unknown_column_mode_is_a_clear_error() -> None:
    from reference_kernels.reduce import RowKnobs, resolve_with_columns

    with pytest.raises(ValueError, match="columns='eager' must be one of early, late, smem"):
        resolve_with_columns(RowKnobs(columns="eager"), 16, 4096, 16, 1, ((None, "early"),))


@pytest.mark.parametrize("bias", [False, True], ids=["rmsnorm_bwd", "layernorm_bwd"])
def test_norm_backward_plans_within_shared_memory(bias: bool) -> None:
    """A tiling that asks for more shared memory than an SM has compiles, and CUDA then
    refuses to launch it (the H100 did at fp32 N=151936: x, dy and w staged at cluster 8,
    240 KiB). Every N and width must plan within the budget."""
    import dataclasses

    from reference_kernels import reduce as R
    from reference_kernels.rmsnorm_bwd import NormBackward
    from reference_kernels.tuning.rmsnorm_bwd import SMEM_BUDGET

    kernel = NormBackward(R.RowKnobs(), bias=bias)
    knobs = dataclasses.replace(R.RowKnobs(), row_loop=2, stage_smem=True)
    for widths in ((16, 16, 16), (32, 32, 32), (16, 16, 32), (32, 16, 32)):
        for n in (*NS, 4100, 200000, R.MAX_N):
            t, weight_in, depth = kernel.plan(knobs, n, widths, max(widths))
            need = kernel.shared_bytes(t, weight_in, widths, depth)
            assert need <= SMEM_BUDGET, (widths, n, t, weight_in, depth)
    t, weight_in, depth = kernel.plan(knobs, 151936, (32, 32, 32), 32)
    assert (t.cluster_n, t.stage_smem, weight_in, depth) == (8, True, "late", 1)
    t, weight_in, _ = kernel.plan(knobs, R.MAX_N, (32, 32, 32), 32)
    assert t.cluster_n == 16 and not t.stage_smem


def test_norm_backward_keeps_two_reduction_stages(capfd: pytest.CaptureFixture[str]) -> None:
    """The norm backward loops over row tiles in every CTA, so its row reduction keeps two
    stages even when a knob set asks for row_loop=1 (one stage crashed the H100 at cluster 2-4:
    a peer's partials for the next tile landed on the current tile's buffer and barrier)."""
    from reference_kernels import reduce as R
    from reference_kernels.layernorm_bwd import LayerNormBackward

    spec = BUILTIN["layernorm_bwd"]
    for knobs in (R.RowKnobs(row_loop=1), R.RowKnobs()):
        kernel = LayerNormBackward(knobs)
        fn = contract.compile_entry(kernel, spec, "bfloat16", 16384, workspace=contract.workspace_of(
            importlib.import_module("reference_kernels.layernorm_bwd")))  # fmt: skip
        assert fn is not None and kernel.tiling.cluster_n > 1 and kernel.tiling.stages == 2
    capfd.readouterr()


@pytest.mark.parametrize(
    ("dtype", "n", "plan"),
    [("bfloat16", 256, ("load", "every")), ("float32", 256, ("smem", "every")), ("bfloat16", 2048, ("smem", "every")),
     ("bfloat16", 4096, ("registers", "holder")), ("bfloat16", 262144, ("registers", "holder"))],
)  # fmt: skip
def test_fused_cross_entropy_plan_by_n(dtype: str, n: int, plan: tuple[str, str], tmp_path: Path) -> None:
    """dlogits need the target column in every thread of a row (the H100 once found the fused
    kernel's short rows missing their `- 1`), so the fused kernel reads the index everywhere and
    takes the loss's logit as its own table says (FUSED_TARGET_LOGIT, ONEHOT); its probabilities
    are the reduction's exponentials (PROBABILITIES "kept"): one exponential a value, not two."""
    import re

    spec = BUILTIN["cross_entropy_fused"]
    mod = importlib.import_module(f"reference_kernels.{spec.reference_module}")
    entry = type(mod.launch)(mod.launch.knobs)
    assert contract.compile_entry(entry, spec, dtype, n, options=f"--keep-ptx --dump-dir={tmp_path}") is not None
    assert (entry.logit_from, entry.onehot, entry.probabilities) == (*plan, "kept")
    if n == 256:
        ptx = "\n".join(p.read_text() for p in tmp_path.rglob("*.ptx"))
        assert len(re.findall(r"ex2\.approx", ptx)) == entry.tiling.values_per_thread


def test_fused_cross_entropy_mode_unknown_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from reference_kernels.tuning import cross_entropy

    spec = BUILTIN["cross_entropy_fused"]
    mod = importlib.import_module(f"reference_kernels.{spec.reference_module}")
    for table, value in (("ONEHOT", "branch"), ("PROBABILITIES", "twice"), ("FUSED_TARGET_LOGIT", "global")):
        with monkeypatch.context() as patch:
            patch.setattr(cross_entropy, table, ((None, value),))
            with pytest.raises(ValueError, match=table.removeprefix("FUSED_")):
                contract.compile_entry(type(mod.launch)(mod.launch.knobs), spec, "bfloat16", 512)


@pytest.mark.parametrize(
    ("op", "n", "fma"),
    [("cross_entropy", 256, True), ("cross_entropy", 512, True), ("cross_entropy", 1024, False),
     ("cross_entropy_fwd", 256, False), ("cross_entropy_fwd", 512, True), ("cross_entropy_fused", 512, False)],
)  # fmt: skip
def test_cross_entropy_exponentials_take_one_fma_where_their_table_says(op: str, n: int, fma: bool) -> None:
    """Each cross-entropy kernel has its own table of where exp(x - max) is one FFMA a value
    (reduce.exp_offset): the loss alone gained with it at 256 and 512, the loss with its lse only
    at 512 (12% slower at 256), dlogits nowhere (evals/results/h100-2026-11-26b)."""
    spec = BUILTIN[op]
    mod = importlib.import_module(f"reference_kernels.{spec.reference_module}")
    entry = type(mod.launch)(mod.launch.knobs)
    assert contract.compile_entry(entry, spec, "bfloat16", n) is not None
    assert entry.exp_fma is fma


def test_cross_entropy_exponential_form_unknown_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from reference_kernels import cross_entropy
    from reference_kernels.tuning import cross_entropy as tables

    spec = BUILTIN["cross_entropy"]
    monkeypatch.setattr(tables, "EXP_OFFSET", ((None, "fused"),))
    with pytest.raises(ValueError, match="EXP_OFFSET"):
        contract.compile_entry(cross_entropy.CrossEntropy(), spec, "bfloat16", 512)


@pytest.mark.parametrize(
    ("n", "knobs", "mode"),
    [(256, {}, "load"), (1000, {}, "smem"), (2048, {}, "smem"), (4096, {}, "registers"),
     (1024, {"stage_smem": False}, "load"), (1024, {"row_loop": 2}, "load")],
)  # fmt: skip
def test_cross_entropy_takes_the_target_logit_from_the_staged_row_only_where_it_may(
    n: int, knobs: dict, mode: str
) -> None:
    """The target logit comes from the staged row ("smem", after a warp barrier) only where the
    row is one warp's and its buffer holds one tile for good: unstaged rows, and a loop whose
    next tile refills the buffer, take it from memory."""
    from reference_kernels.cross_entropy import CrossEntropy
    from reference_kernels.reduce import RowKnobs

    entry = CrossEntropy(RowKnobs(**knobs))
    assert contract.compile_entry(entry, BUILTIN["cross_entropy"], "bfloat16", n) is not None
    assert entry.logit_from == mode


@pytest.mark.parametrize(
    ("op", "dtype", "n", "staged"),
    [("cross_entropy", "bfloat16", 512, True), ("cross_entropy_fwd", "bfloat16", 512, True),
     ("cross_entropy", "bfloat16", 256, False), ("cross_entropy", "bfloat16", 1024, False),
     ("cross_entropy", "float32", 512, False), ("cross_entropy_fused", "bfloat16", 512, False)],
)  # fmt: skip
def test_cross_entropy_stages_its_target_index_in_the_rows_commit_group_where_its_table_says(
    op: str, dtype: str, n: int, staged: bool, tmp_path: Path
) -> None:
    """Where INDEX_LOAD says "staged" (bf16 at 512, evals/results/h100-2026-11-26c) the row
    leader's target index is an 8-byte cp.async issued before the row's copies are committed,
    so the row's one wait covers it, and no global load of the index is left for ptxas to
    move past that wait. Elsewhere it stays a plain load."""
    spec = BUILTIN[op]
    mod = importlib.import_module(f"reference_kernels.{spec.reference_module}")
    entry = type(mod.launch)(mod.launch.knobs)
    assert contract.compile_entry(entry, spec, dtype, n, options=f"--keep-ptx --dump-dir={tmp_path}") is not None
    assert entry.staged_index is staged
    (ptx,) = [p.read_text() for p in tmp_path.glob("*.ptx")]
    body = ptx[ptx.index(".entry") :]
    index_copy = re.search(r"cp\.async\.ca\.shared\.global \[[^]]+\], \[[^]]+\], 8, 8;", body)
    if staged:
        assert index_copy is not None
        assert index_copy.start() < body.index("cp.async.commit_group")
        assert "ld.global.b64" not in body
    else:
        assert index_copy is None


@pytest.mark.parametrize(
    ("op", "dtype", "n", "per_sm"),
    [("rmsnorm_bwd", "bfloat16", 512, 8), ("rmsnorm_bwd", "bfloat16", 1024, 4), ("layernorm_bwd", "bfloat16", 1024, 8),
     ("rmsnorm_bwd", "float32", 1024, 4), ("layernorm_bwd", "float32", 1024, 4)],
)  # fmt: skip
def test_norm_backward_keeps_its_own_ctas_a_sm_on_short_rows(op: str, dtype: str, n: int, per_sm: int) -> None:
    """Short rows keep as many CTAs a SM in the grid as each op's table says: 32-bit rows up to
    1024 take 4 (CTAS_PER_SM_32BIT; H100 32768x1024 fp32 rmsnorm_bwd 2.758 TB/s at 4, 2.562 at
    8); 16-bit rows at 1024 take 4 for RMSNorm (2.514 against 2.423 at 8) and 8 for LayerNorm
    (2.217 against 1.991 at 4)."""
    from reference_kernels.tuning import rmsnorm_bwd

    spec = BUILTIN[op]
    mod = importlib.import_module(f"reference_kernels.{spec.reference_module}")
    entry = type(mod.launch)(mod.launch.knobs)
    assert contract.compile_entry(entry, spec, dtype, n, workspace=contract.workspace_of(mod)) is not None
    assert entry.cap == rmsnorm_bwd.NUM_SMS * per_sm


@pytest.mark.parametrize(
    ("op", "dtype", "n", "parts", "cta"),
    [("layernorm_bwd", "float32", 262144, 8, True), ("rmsnorm_bwd", "float32", 262144, 8, True),
     ("layernorm_bwd", "bfloat16", 32768, 2, False), ("rmsnorm_bwd", "bfloat16", 32768, 2, False),
     ("layernorm_bwd", "float32", 16384, 1, False), ("layernorm_bwd", "bfloat16", 262144, 1, False),
     ("rmsnorm_bwd", "float32", 32768, 1, False),
     ("layernorm_bwd", "float32", 151936, 1, True)],
)  # fmt: skip
def test_norm_backward_refills_in_parts_where_its_tables_say(
    op: str, dtype: str, n: int, parts: int, cta: bool, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Where one tile is staged, the second pass goes in parts as REFILL_PARTS(_32BIT) says, each
    part's copies issued before that part's dx is stored (H100 layernorm_bwd fp32 1024x262144:
    2.871-2.878 TB/s with the folded sends, against 2.563-2.573; evals/results/row-backward).
    Whole elsewhere: fp32 16384 (the table), bf16 256K and fp32 32768 (two tiles staged), fp32
    151936 (padding columns: a thread's vectors do not split). The 32-bit folded sends are taken past 131072.
    No spills where the parts are taken."""
    spec = BUILTIN[op]
    mod = importlib.import_module(f"reference_kernels.{spec.reference_module}")
    entry = type(mod.launch)(mod.launch.knobs)
    options = f"--keep-ptx --dump-dir={tmp_path} remarks{{ptx}}"
    assert contract.compile_entry(entry, spec, dtype, n, options=options, workspace=contract.workspace_of(mod))
    assert (entry.refill_parts, entry.cta_first) == (parts, cta)
    if parts == 1:
        return
    assert max(_spill_stores("".join(capfd.readouterr()))) == 0
    (ptx,) = [p.read_text() for p in tmp_path.glob("*.ptx")]
    body = ptx[ptx.index(".entry") :]
    # the loop's refill: `parts` groups a tensor, the first dx stores between them
    loop = body[body.rindex("cp.async.wait_group") :]
    assert loop.count("cp.async.commit_group") == 2 * parts
    assert loop.index("cp.async.commit_group") < loop.index("st.global") < loop.rindex("cp.async.commit_group")


@pytest.mark.parametrize("op", ["rmsnorm_bwd", "layernorm_bwd"])
def test_norm_backward_long_rows_overlap_reductions_in_whole_waves(op: str) -> None:
    """Long clustered rows: a grid of as many clusters as the H100 runs at once (7 of 16, 14 of
    8: one more of 16 ran at 55% of copy, evals/results/h100-2026-11-24i), and where three
    staged tiles fit, each tile's cluster reduction overlapped with the next tile's sums."""
    from reference_kernels.reduce import RowKnobs
    from reference_kernels.tuning import rmsnorm_bwd

    spec = BUILTIN[op]
    mod = importlib.import_module(f"reference_kernels.{spec.reference_module}")
    seen = {}
    for dtype, n in (("bfloat16", 16384), ("bfloat16", 65536), ("bfloat16", 131072), ("bfloat16", 262144),
                     ("float32", 32768), ("float32", 65536)):  # fmt: skip
        entry = type(mod.launch)(RowKnobs())
        assert contract.compile_entry(entry, spec, dtype, n, workspace=contract.workspace_of(mod)) is not None
        seen[dtype, n] = (entry.tiling.cluster_n, entry.overlap, entry.depth, entry.cap)
        widths = (16 if dtype == "bfloat16" else 32,) * 3
        need = entry.shared_bytes(entry.tiling, entry.weight_in, widths, entry.depth)
        assert need <= rmsnorm_bwd.SMEM_BUDGET, (dtype, n, need)
    assert seen["bfloat16", 16384][:3] == (2, False, 2)
    assert seen["bfloat16", 65536] == (8, True, 3, 14)
    assert seen["bfloat16", 131072] == (16, True, 3, 7)
    assert seen["bfloat16", 262144] == (16, False, 2, 7)  # (three tiles and w: past the budget)
    assert seen["float32", 65536] == (8, False, 2, 14)
    # (two fp32 tiles of 32768 staged: LayerNorm on a cluster of 8, layernorm_bwd.KNOBS_32BIT)
    assert seen["float32", 32768] == ((8, False, 2, 14) if op == "layernorm_bwd" else (4, False, 2, 132))


@pytest.mark.parametrize("op", ["rmsnorm_bwd", "layernorm_bwd"])
def test_norm_backward_holds_staged_rows_where_its_table_says(
    op: str, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """rmsnorm_bwd.SECOND_READ (a table for sweeps, "smem" by default): x and dy kept in registers
    across the reduction, each buffer refilled once read, build at two staged tiles (bf16 4096,
    also in QuACK's shape: 128 threads, 32 values a thread) and at one (fp32 16384), without
    spills; not in the overlapped loop; nowhere by default; a mode it does not know is an error."""
    from reference_kernels.reduce import RowKnobs
    from reference_kernels.tuning import rmsnorm_bwd

    spec = BUILTIN[op]
    mod = importlib.import_module(f"reference_kernels.{spec.reference_module}")
    ws = contract.workspace_of(mod)
    default = type(mod.launch)(RowKnobs())
    assert contract.compile_entry(default, spec, "bfloat16", 4096, workspace=ws)
    assert default.second_read == "smem"
    capfd.readouterr()
    monkeypatch.setattr(rmsnorm_bwd, "SECOND_READ", ((None, "registers"),))
    quack_shape = RowKnobs(threads_per_row=128, num_threads=128, cluster_n=1)
    for knobs, dtype, n, depth in ((RowKnobs(), "bfloat16", 4096, 2), (quack_shape, "bfloat16", 4096, 2),
                                   (RowKnobs(), "float32", 16384, 1), (RowKnobs(), "bfloat16", 65536, 3)):  # fmt: skip
        entry = type(mod.launch)(knobs)
        assert contract.compile_entry(entry, spec, dtype, n, options="remarks{ptx}", workspace=ws) is not None
        assert entry.depth == depth
        assert entry.second_read == ("smem" if entry.overlap else "registers"), (dtype, n)
        text = "".join(capfd.readouterr())
        spills = _spill_stores(text)
        assert spills and max(spills) == 0, f"{op} {knobs} {dtype} N={n}\n{text[-1500:]}"
    monkeypatch.setattr(rmsnorm_bwd, "SECOND_READ", ((None, "gmem"),))
    with pytest.raises(ValueError, match="SECOND_READ"):
        contract.compile_entry(type(mod.launch)(RowKnobs()), spec, "bfloat16", 4096, workspace=ws)


@pytest.mark.parametrize(
    ("op", "dtype", "n", "forms", "tpr"),
    [
        ("rmsnorm_bwd", "bfloat16", 4096, (), 128),  # QuACK's shape (rmsnorm_bwd.KNOBS_16BIT)
        ("rmsnorm_bwd", "bfloat16", 16384, (), 512),
        ("rmsnorm_bwd", "bfloat16", 262144, ("dx", "sums"), 512),
        ("rmsnorm_bwd", "float32", 262144, (), 512),
        ("layernorm_bwd", "bfloat16", 4096, (), 256),
        ("layernorm_bwd", "bfloat16", 16384, ("xhat", "sums"), 512),
        ("layernorm_bwd", "bfloat16", 262144, ("dx", "xhat", "sums"), 512),
        ("layernorm_bwd", "float32", 262144, ("dx", "xhat", "sums"), 512),
    ],
)
def test_norm_backward_arithmetic_and_shape_by_op(op: str, dtype: str, n: int, forms: tuple, tpr: int) -> None:
    """Each norm backward takes its own table's arithmetic forms and 16-bit knob sets (the
    forms that won at one N lost 10-30% at another, by op: rmsnorm_bwd.ARITHMETIC_16BIT)."""
    from reference_kernels.reduce import RowKnobs

    spec = BUILTIN[op]
    mod = importlib.import_module(f"reference_kernels.{spec.reference_module}")
    entry = type(mod.launch)(RowKnobs())
    assert contract.compile_entry(entry, spec, dtype, n, workspace=contract.workspace_of(mod)) is not None
    assert tuple(entry.arithmetic) == forms
    assert entry.tiling.threads_per_row == tpr


def test_norm_backward_arithmetic_form_unknown_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from reference_kernels import rmsnorm_bwd
    from reference_kernels.reduce import RowKnobs
    from reference_kernels.tuning import rmsnorm_bwd as tables

    spec = BUILTIN["rmsnorm_bwd"]
    monkeypatch.setattr(tables, "ARITHMETIC_16BIT", ((None, ("dx", "fast")),))
    with pytest.raises(ValueError, match="ARITHMETIC"):
        contract.compile_entry(rmsnorm_bwd.NormBackward(RowKnobs()), spec, "bfloat16", 8192,
                               workspace=rmsnorm_bwd.WORKSPACE)  # fmt: skip


def test_widen_bits_replaces_the_bf16_conversions(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """rmsnorm_bwd.WIDEN_BF16 "bits" (a table for sweeps): bf16 pairs become fp32 by a shift and a
    mask, no cvt.f32.bf16 left in the row kernel; "cvt" (the default) keeps them."""
    from reference_kernels.reduce import RowKnobs
    from reference_kernels.tuning import rmsnorm_bwd

    spec = BUILTIN["layernorm_bwd"]
    mod = importlib.import_module(f"reference_kernels.{spec.reference_module}")

    def row_kernel_ptx(out: Path) -> str:
        out.mkdir()
        entry = type(mod.launch)(RowKnobs())
        options = f"--keep-ptx --dump-dir={out}"
        assert contract.compile_entry(entry, spec, "bfloat16", 65536, options=options, workspace=mod.WORKSPACE)
        ptx = "\n".join(p.read_text() for p in out.rglob("*.ptx"))
        return ptx[ptx.index(".entry kernel_cutlass_kernel") :]

    assert "cvt.f32.bf16" in row_kernel_ptx(tmp_path / "cvt")
    monkeypatch.setattr(rmsnorm_bwd, "WIDEN_BF16", ((None, "bits"),))
    bits = row_kernel_ptx(tmp_path / "bits")
    assert "cvt.f32.bf16" not in bits and "and.b32" in bits


def test_norm_backward_tile_chunks_wait_on_each_chunk(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """rmsnorm_bwd.TILE_CHUNKS (a table for sweeps, 1 by default): at one staged tile (fp32
    262144), a tile's copies go out as one commit group a tensor and chunk, the first pass waits
    on each chunk alone (wait_group 2, then 0 at two chunks), and the second pass sends the next
    tile chunk by chunk; the default keeps one group a tensor and one wait."""
    import re

    from reference_kernels.reduce import RowKnobs
    from reference_kernels.tuning import rmsnorm_bwd

    spec = BUILTIN["layernorm_bwd"]
    mod = importlib.import_module(f"reference_kernels.{spec.reference_module}")

    def row_kernel(out: Path) -> tuple[list[str], int]:
        out.mkdir()
        entry = type(mod.launch)(RowKnobs())
        options = f"--keep-ptx --dump-dir={out}"
        assert contract.compile_entry(entry, spec, "float32", 262144, options=options, workspace=mod.WORKSPACE)
        ptx = "\n".join(p.read_text() for p in out.rglob("*.ptx"))
        ptx = ptx[ptx.index(".entry kernel_cutlass_kernel") :]
        ops = [" ".join(op.split()) for op in re.findall(r"cp\.async\.(wait_group\s+\d+|commit_group)", ptx)]
        return ops, entry.chunks

    def shape(ops: list[str]) -> tuple[list[str], int]:
        # the waits in order (w's, then the loop's), and tile 0's groups between w's and the loop's
        waits = [op for op in ops if op.startswith("wait")]
        at = [i for i, op in enumerate(ops) if op.startswith("wait")]
        return waits, at[1] - at[0] - 1

    ops, chunks = row_kernel(tmp_path / "one")
    assert chunks == 1 and shape(ops) == (["wait_group 0", "wait_group 0"], 2)
    monkeypatch.setattr(rmsnorm_bwd, "TILE_CHUNKS", ((None, 2),))
    ops, chunks = row_kernel(tmp_path / "two")
    assert chunks == 2 and shape(ops) == (["wait_group 0", "wait_group 2", "wait_group 0"], 4)


def test_log_softmax_backward_takes_exp_before_its_reduction_on_long_rows(tmp_path: Path) -> None:
    """softmax_bwd.LOG_EXP: past 16K the exponentials come before the cluster reduction's sends
    and wait in the PTX (a plain exp2 there was sunk to its use, after the wait); at 16384 after."""
    spec = BUILTIN["log_softmax_bwd"]
    mod = importlib.import_module(f"reference_kernels.{spec.reference_module}")
    short = type(mod.launch)(mod.launch.knobs)
    assert contract.compile_entry(short, spec, "bfloat16", 16384) and not short.exp_first
    entry = type(mod.launch)(mod.launch.knobs)
    assert contract.compile_entry(entry, spec, "bfloat16", 262144, options=f"--keep-ptx --dump-dir={tmp_path}")
    ptx = "\n".join(p.read_text() for p in tmp_path.rglob("*.ptx"))
    assert entry.exp_first and entry.tiling.cluster_n > 1
    assert ptx.rindex("ex2.approx") < ptx.index("mbarrier.try_wait")


def test_fitting_chunks() -> None:
    """A thread's vectors split into equal whole chunks; a row with padding columns takes none."""
    from reference_kernels import reduce as R

    t = R.resolve_tiling(R.RowKnobs(cluster_n=16), 32, 262144, 32, 4, rows.THREADS_PER_ROW)
    assert t.values_per_thread // t.vec == 8
    assert [R.fitting_chunks(t, c) for c in (1, 2, 4, 8, 16)] == [1, 2, 4, 8, 8]
    odd = R.resolve_tiling(R.RowKnobs(), 32, 5001, 32, 4, rows.THREADS_PER_ROW)
    assert not odd.even_n and R.fitting_chunks(odd, 4) == 1
    with pytest.raises(ValueError, match="power of two"):
        R.fitting_chunks(t, 3)


def test_cta_first_scratch_takes_one_slot_a_peer() -> None:
    """Folded in the CTA first, a cluster reduction's slots are one a peer (and one a warp for
    the CTA's own fold), not one a warp and peer: at cluster 16 with 16 warps a row, 8 KiB of
    layernorm's four stages become 1 KiB. Without peers or without warps to fold, nothing
    changes."""
    from reference_kernels import reduce as R

    t = R.resolve_tiling(R.RowKnobs(cluster_n=16, row_loop=2), 16, 262144, 16, 4, rows.THREADS_PER_ROW)
    assert (t.cluster_n, t.warps_per_row) == (16, 16)
    assert R.scratch_bytes(t, 2, 4) == 8192
    assert R.scratch_bytes(t, 2, 4, cta_first=True) == 1024
    one = R.resolve_tiling(R.RowKnobs(cluster_n=1, row_loop=2), 16, 4096, 16, 4, rows.THREADS_PER_ROW)
    assert not R.folds_in_cta(one, True) and R.scratch_bytes(one, 1, 2, True) == R.scratch_bytes(one, 1, 2)


@pytest.mark.parametrize("op", ["rmsnorm_bwd", "layernorm_bwd"])
def test_norm_backward_folds_in_the_cta_where_its_table_says(
    op: str, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """rmsnorm_bwd.CLUSTER_SEND (16-bit rows; "warps" by default, a table for sweeps): with "cta" a row's
    warps fold their sums before one warp sends them to the peers, in the one-tile loop (bf16
    16384, cluster 2) and the overlapped one (65536); at bf16 262144 the smaller scratch lets
    three staged tiles and w in, within what a CTA may have, so the overlap is taken there.
    Next to no spills; a mode it does not know is an error."""
    from reference_kernels import reduce as R
    from reference_kernels.reduce import RowKnobs
    from reference_kernels.tuning import rmsnorm_bwd

    spec = BUILTIN[op]
    mod = importlib.import_module(f"reference_kernels.{spec.reference_module}")
    ws = contract.workspace_of(mod)
    default = type(mod.launch)(RowKnobs())
    assert contract.compile_entry(default, spec, "bfloat16", 262144, workspace=ws)
    assert not default.cta_first and not default.overlap
    capfd.readouterr()
    monkeypatch.setattr(rmsnorm_bwd, "CLUSTER_SEND", ((None, "cta"),))
    for n, cluster, overlap in ((16384, 2, False), (65536, 8, True), (262144, 16, True)):
        entry = type(mod.launch)(RowKnobs())
        assert contract.compile_entry(entry, spec, "bfloat16", n, options="remarks{ptx}", workspace=ws) is not None
        t = entry.tiling
        assert (entry.cta_first, t.cluster_n, entry.overlap) == (True, cluster, overlap), n
        arity = 2 if entry.bias else 1
        need = entry.shared_bytes(t, entry.weight_in, (16, 16, 16), entry.depth)
        need += R.scratch_bytes(t, arity, rmsnorm_bwd.OVERLAP_STAGES if overlap else 0, cta_first=True)
        assert need <= rmsnorm_bwd.SMEM_PER_CTA, (n, need)
        text = "".join(capfd.readouterr())
        spills = _spill_stores(text)
        # (ptxas settles rmsnorm_bwd's at 65536 in 64 registers and 4 B of spill)
        assert spills and max(spills) <= 4, f"{op} N={n}\n{text[-1500:]}"
    monkeypatch.setattr(rmsnorm_bwd, "CLUSTER_SEND", ((None, "block"),))
    with pytest.raises(ValueError, match="CLUSTER_SEND"):
        contract.compile_entry(type(mod.launch)(RowKnobs()), spec, "bfloat16", 4096, workspace=ws)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("op", ["attention", "attention_causal_d64"])
def test_ampere_attention_compiles_for_sm90a(op: str, dtype: str, capfd: pytest.CaptureFixture[str]) -> None:
    """The Ampere attention kernel (an offline candidate, not the reference) builds at the
    grid's N and at partial tiles, without spills."""
    from reference_kernels.attention_sm80 import AttentionSm80

    spec = BUILTIN[op]
    for n in (129, 1000, 4096, 16384):
        entry = AttentionSm80(causal="causal" in op)
        assert contract.compile_entry(entry, spec, dtype, n, options="remarks{ptx}") is not None
        text = "".join(capfd.readouterr())
        spills = _spill_stores(text)
        assert spills and max(spills) == 0, f"{op} {dtype} N={n}\n{text[-1500:]}"


@pytest.mark.parametrize(
    ("n", "d", "warps_m"), [(64, 128, 2), (192, 384, 2), (512, 1024, 1), (512, 1024, 2), (512, 1024, 4)]
)
def test_fp32_attention_compiles_for_sm90a(n: int, d: int, warps_m: int, capfd: pytest.CaptureFixture[str]) -> None:
    """The fp32 attention for wide heads (97_ScaledDotProductAttention's kernel) builds at one
    query tile, at 64 x 3 keys and at 97's own shape in every warp layout, its 128 scores a
    thread in registers."""
    from evals.scripts.attention_fp32 import signature as tf32_signature
    from reference_kernels.attention_tf32 import AttentionTf32

    entry = AttentionTf32(warps_m)
    assert contract.compile_entry(entry, tf32_signature(d), "float32", n, options="remarks{ptx}")
    text = "".join(capfd.readouterr())
    spills = _spill_stores(text)
    assert spills and max(spills) == 0, f"N={n} D={d}\n{text[-1500:]}"


def test_fp32_attention_says_which_shapes_it_takes() -> None:
    from evals.scripts.attention_fp32 import signature as tf32_signature
    from reference_kernels.attention_tf32 import AttentionTf32, check_shape, smem_floats

    assert check_shape(512, 1024) == "" and check_shape(64, 128) == ""
    assert "at most 512" in check_shape(1024, 1024) and "multiple of 64" in check_shape(500, 1024)
    assert "head dim 96" in check_shape(512, 96)
    for d in (128, 1024):  # one CTA an SM, within Hopper's opt-in shared memory
        assert smem_floats(512, d) * 4 <= 227 * 1024
    with pytest.raises(ValueError, match="warps_m=3"):
        AttentionTf32(3)
    with pytest.raises(Exception, match="at most 512"):
        contract.compile_entry(AttentionTf32(), tf32_signature(128), "float32", 1024)


def test_softmax_stages_its_rows_unless_the_staged_tile_is_large() -> None:
    """fp32 rows of 393216 (KernelBench 23) stage 96 KB a CTA: those go direct, from registers."""
    from reference_kernels import softmax as S

    spec = BUILTIN["softmax"]
    for dtype, n, staged in (("float32", 393216, False), ("float32", 262144, True), ("bfloat16", 393216, True)):
        contract.compile_entry(S.launch, spec, dtype, n)
        assert S.launch.tiling.stage_smem is staged, (dtype, n)


# The first instruction of a kernel that may touch global memory: a load, store, copy or atomic
# in the global or the generic state space (a generic address may be a global one).
GLOBAL_ACCESS = re.compile(
    r"^\s*(?:@!?%p\d+\s+)?(?:ld|st|red|atom|prefetch|cp\.async(?!\.(?:commit|wait)))\.(?!shared|param|local|const)\S*",
    re.M,
)


def _launches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    """(kernel, dependent launch) for each launch traced from now on."""
    from cutlass.cutlass_dsl.cutlass import KernelLauncher

    seen: list[tuple[str, bool]] = []
    launch = KernelLauncher.launch

    def recording(self, *args, **kwargs):  # noqa: ANN001, ANN202 - the DSL's own signature
        seen.append((self.funcBody.__name__, bool(kwargs.get("use_pdl", False))))
        return launch(self, *args, **kwargs)

    monkeypatch.setattr(KernelLauncher, "launch", recording)
    return seen


@pytest.mark.parametrize("dependent", [True, False], ids=["dependent", "off"])
@pytest.mark.parametrize(
    ("op", "dtype", "n"),
    [(op, "bfloat16", 512) for op in sorted(BUILTIN) if not BUILTIN[op].compute_bound]
    + [("layernorm", "float32", 65536), ("rmsnorm_bwd", "bfloat16", 262144), ("cross_entropy", "float32", 131072)],
)
def test_row_kernels_launch_dependent_and_wait_before_touching_global_memory(
    op: str, dtype: str, n: int, dependent: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Where DEPENDENT_LAUNCH says so every kernel of a row op is launched as a programmatic
    dependent, which may start while the stream's previous kernel still runs: each must then
    wait for that grid (griddepcontrol.wait) before its first global access. Off, no launch is
    dependent and no kernel waits."""

    monkeypatch.setattr(rows, "DEPENDENT_LAUNCH", ((None, dependent),))
    launches = _launches(monkeypatch)
    spec = BUILTIN[op]
    mod = importlib.import_module(f"reference_kernels.{spec.reference_module}")
    entry = type(mod.launch)(mod.launch.knobs)
    options = f"--keep-ptx --dump-dir={tmp_path}"
    assert contract.compile_entry(entry, spec, dtype, n, options=options, workspace=contract.workspace_of(mod))
    assert launches and all(pdl is dependent for _, pdl in launches), launches
    ptx = "\n".join(p.read_text() for p in tmp_path.rglob("*.ptx"))
    bodies = ptx.split(".entry ")[1:]
    assert len(bodies) == len(launches)
    for body in bodies:
        if dependent:
            assert_waits_before_global_access(body)
        else:
            assert "griddepcontrol" not in body, body.split("(", 1)[0]


def test_a_kernel_launched_without_saying_it_waits_launches_plainly(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A row kernel as a candidate writes one (the LLM answers in shared/llm-answers call
    launch_rows and never await_previous_grid): it is not launched as a dependent, so it
    cannot start before the kernel it reads from has ended."""
    import functools

    import cutlass.cute as cute

    from reference_kernels import reduce as R

    class CandidateCopy:
        knobs = R.RowKnobs(stage_smem=False)

        # (no annotations: this module's are strings, which cute.jit resolves in its globals)
        @cute.jit
        def __call__(self, mX, mO, stream):  # noqa: ANN001, ANN204
            self.tiling = R.resolve_tiling(self.knobs, mX.element_type.width, mX.shape[1])
            copy = R.row_tiled_copy(mX.element_type, self.tiling)
            R.launch_rows(self.kernel(mX, mO, copy), self.tiling, mX.shape[0], stream)

        @cute.kernel
        def kernel(self, mX, mO, copy):  # noqa: ANN001, ANN202
            tidx, _, _ = cute.arch.thread_idx()
            R.for_each_row(self.tiling, copy, mX, None, tidx, 0.0, functools.partial(self.row, mO))

        @cute.jit
        def row(self, mO, ctx, tXrX):  # noqa: ANN001, ANN202
            R.store_row(ctx, tXrX.load(), mO)

    assert R.pick(rows.DEPENDENT_LAUNCH, 4096)  # (else this would pass for nothing)
    launches = _launches(monkeypatch)
    options = f"--keep-ptx --dump-dir={tmp_path}"
    assert contract.compile_entry(CandidateCopy(), BUILTIN["copy"], "bfloat16", 4096, options=options)
    assert len(launches) == 1 and launches[0][1] is False
    ptx = "\n".join(p.read_text() for p in tmp_path.rglob("*.ptx"))
    assert ".entry" in ptx and "griddepcontrol" not in ptx


@pytest.mark.parametrize("op", ["softmax", "rmsnorm_bwd"])
def test_a_kernel_that_says_it_waits_and_never_does_is_an_error(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A launch that waits (launch_rows or launch_kernel, waits=True) whose kernel never
    called await_previous_grid while it was traced: refused when compiled, not launched early."""
    from reference_kernels import reduce as R

    monkeypatch.setattr(R, "await_previous_grid", lambda tiling: None)
    spec = BUILTIN[op]
    mod = importlib.import_module(f"reference_kernels.{spec.reference_module}")
    entry = type(mod.launch)(mod.launch.knobs)
    with pytest.raises(Exception, match="never called await_previous_grid"):
        contract.compile_entry(entry, spec, "bfloat16", 4096, workspace=contract.workspace_of(mod))


def assert_waits_before_global_access(body: str) -> None:
    """A kernel's PTX (from its .entry on) waits once for the previous grid, before it first
    touches global memory."""
    name = body.split("(", 1)[0]
    first = GLOBAL_ACCESS.search(body)
    assert first is not None, name
    assert body.count("griddepcontrol.wait") == 1, name
    assert body.index("griddepcontrol.wait") < first.start(), f"{name}: {first.group(0)} before the wait"


@pytest.mark.parametrize("op", sorted(op for op, spec in BUILTIN.items() if spec.flat_rows))
def test_an_entry_rebuilt_from_its_knobs_is_the_same_kernel(op: str) -> None:
    """Swept and tested knobs make `type(launch)(knobs)` (runtime/compiled.reference_function): the
    class alone must say which kernel it is (a log-softmax's combine, a LayerNorm's bias), not an
    argument only the module's own `launch` was given. (Attention's entries take `causal` first:
    reference_function refuses knobs for them.)"""
    entry = contract.entry_of(importlib.import_module(f"reference_kernels.{BUILTIN[op].reference_module}"))
    rebuilt = vars(type(entry)(entry.knobs))
    # (what the constructor set; a compile adds what it traced, as the tiling, to the module's own)
    assert rebuilt == {k: v for k, v in vars(entry).items() if k in rebuilt}


def test_knobs_for_an_op_that_is_not_rows_are_refused() -> None:
    from llmcompile.kernels import reference_function
    from llmcompile.specs import OpError
    from reference_kernels.reduce import RowKnobs

    with pytest.raises(OpError, match="RowKnobs"):
        reference_function("attention_causal", RowKnobs())


@pytest.mark.parametrize(
    "op", sorted(op for op, spec in BUILTIN.items() if spec.flat_rows and any(t.dims == ("N",) for t in spec.tensors))
)
def test_ops_with_weights_compile_with_them_in_fp32_beside_bf16_rows(
    op: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """Mixed precision keeps weights (and their gradients) in fp32: each op with (N,) tensors also
    compiles that way (runtime/compiled.vectors_in_fp32, what KernelFunction.vectors32 runs), without spills
    past the budget, at a short and an uneven row."""
    from llmcompile.runtime.compiled import vectors_in_fp32

    spec = vectors_in_fp32(BUILTIN[op])
    mod = importlib.import_module(f"reference_kernels.{spec.reference_module}")
    for n in (1024, 5001):
        fn = contract.compile_entry(
            contract.entry_of(mod), spec, "bfloat16", n, options="remarks{ptx}", workspace=contract.workspace_of(mod)
        )
        spills = _spill_stores("".join(capfd.readouterr()))
        assert fn is not None and spills and max(spills) <= spill_budget(op, n), f"{op} N={n}: {spills}"


def test_a_chan_block_sums_elements_only_where_counts_are_literals() -> None:
    """(A register's `==` is a DSL value, once taken for True.)"""
    from reference_kernels.reduce import _known

    seen = []

    @cute.jit
    def probe(n: Int32) -> None:
        seen.append((_known(Float32(n), 1.0), _known(Float32(1.0), 1.0), _known(Float32(0.0), 1.0)))

    probe(Int32(1))
    assert seen == [(False, True, False)]
