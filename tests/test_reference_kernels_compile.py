"""CI, no GPU: every reference kernel compiles for sm_90a across the dtype x N grid, without
more than a token spill (layernorm at long odd N keeps x, weight and bias in registers and
spills a few bytes there; anything larger means a heuristic table is wrong)."""

from __future__ import annotations

import importlib
import re

import pytest

from llmcompile import contract
from llmcompile.ops import BUILTIN

NS = (256, 1024, 4096, 5000, 5001, 16384, 65536, 128256, 151936, 262144)
DTYPES = ("float32", "bfloat16", "float16")
MAX_SPILL_BYTES = 64  # layernorm fp32 N=151936 spills 52 B at its 128-register cap (512 threads)
# The norms' backward past 64K (512-thread CTAs, 128 registers): two fp32 column sums and the
# row's fp32 temporaries spill up to 440 B (layernorm fp32 N=151936). Not yet timed on the H100.
MAX_SPILL_BYTES_BWD_LONG = 512


def spill_budget(op: str, n: int) -> int:
    return MAX_SPILL_BYTES_BWD_LONG if op in ("rmsnorm_bwd", "layernorm_bwd") and n >= 65536 else MAX_SPILL_BYTES


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", sorted(BUILTIN))
def test_compiles_for_sm90a(op: str, dtype: str, capfd: pytest.CaptureFixture[str]) -> None:
    spec = BUILTIN[op]
    mod = importlib.import_module(f"reference_kernels.{spec.reference_module}")
    entry, workspace = contract.entry_of(mod), contract.workspace_of(mod)
    for n in NS:
        fn = contract.compile_entry(entry, spec, dtype, n, options="remarks{ptx}", workspace=workspace)
        assert fn is not None
        report = capfd.readouterr()
        text = report.out + report.err
        spills = [int(s) for s in re.findall(r"(\d+) bytes spill stores", text)]
        assert spills and max(spills) <= spill_budget(op, n), (
            f"{op} {dtype} N={n}: spills or no ptxas report\n{text[-2000:]}"
        )


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
            spills = [int(s) for s in re.findall(r"(\d+) bytes spill stores", text)]
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
            spills = [int(s) for s in re.findall(r"(\d+) bytes spill stores", text)]
            assert spills and max(spills) <= MAX_SPILL_BYTES, f"{op} {knobs} {mode} {dtype} N={n}\n{text[-1500:]}"


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
