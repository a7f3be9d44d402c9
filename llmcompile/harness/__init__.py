"""The judge: the only way any kernel gets a verdict (`judge.py`; the stages in their own modules).

`Judge`, `JudgeOptions`, `evaluate` and the verdict statuses resolve on first use, so a sandboxed
compile process can import the harness's pieces without the judge's own dependencies (torch)."""

from __future__ import annotations

import importlib
from typing import Any

_JUDGE = ("Judge", "JudgeOptions", "evaluate", "gpu_available", "profiled_message", "source_sha", "verdict_key")


def __getattr__(name: str) -> Any:
    if name in _JUDGE:
        return getattr(importlib.import_module("llmcompile.harness.judge"), name)
    verdict = importlib.import_module("llmcompile.harness.verdict")
    if name.isupper() or name == "Verdict":  # the statuses, STAGES, PASSING
        return getattr(verdict, name)
    raise AttributeError(f"module 'llmcompile.harness' has no attribute {name!r}")
