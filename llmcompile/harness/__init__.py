"""The judge: the only way any kernel gets a verdict (`judge.py`; the stages in their own modules).

Exports resolve on first use, so a sandboxed compile process can import the harness's pieces
without the judge's own dependencies (torch)."""

from __future__ import annotations

import importlib
from typing import Any

from llmcompile.harness.verdict import (  # noqa: F401 - re-exported
    COMPILE_ERROR,
    COMPILED,
    CRASHED,
    PASSING,
    PROFILED,
    STAGES,
    STATIC_REJECTED,
    SUSPICIOUS,
    TIMEOUT,
    VERIFIED,
    WRONG,
    Verdict,
)

_JUDGE = ("Judge", "JudgeOptions", "evaluate", "gpu_available", "source_sha", "verdict_key")


def __getattr__(name: str) -> Any:
    if name in _JUDGE:
        return getattr(importlib.import_module("llmcompile.harness.judge"), name)
    raise AttributeError(f"module 'llmcompile.harness' has no attribute {name!r}")
