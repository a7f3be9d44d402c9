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
MAX_SPILL_BYTES = 32


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", sorted(BUILTIN))
def test_compiles_for_sm90a(op: str, dtype: str, capfd: pytest.CaptureFixture[str]) -> None:
    spec = BUILTIN[op]
    entry = contract.entry_of(importlib.import_module(f"reference_kernels.{spec.reference_module}"))
    for n in NS:
        fn = contract.compile_entry(entry, spec, dtype, n, options="remarks{ptx}")
        assert fn is not None
        report = capfd.readouterr()
        text = report.out + report.err
        spills = [int(s) for s in re.findall(r"(\d+) bytes spill stores", text)]
        assert spills and max(spills) <= MAX_SPILL_BYTES, (
            f"{op} {dtype} N={n}: spills or no ptxas report\n{text[-2000:]}"
        )
