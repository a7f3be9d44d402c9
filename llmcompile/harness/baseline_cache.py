"""Baselines' timings kept across runs, by what makes them what they are: the GPU, the software
that timed them (torch, triton, QuACK, Liger), the problem, its dtype and shape.

torch.compile spends tens of seconds compiling a problem before its first timing; a report needs
its number, not a fresh compile, each time the same problem is judged on the same machine. So the
judge times a baseline once per such key and reuses the number for MAX_AGE_S, showing how old it
is wherever it appears (`ShapeTiming.baseline_age_s`). One JSON file under the judge's cache
directory, written by the judge (never the GPU worker) through a temporary file and a rename.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

MAX_AGE_S = 7 * 24 * 3600.0


def default_path() -> Path:
    base = Path(os.environ.get("LLMCOMPILE_CACHE", Path.home() / ".cache" / "llmcompile"))
    return base / "baselines.json"


def problem_id(ref: str) -> str:
    """A built-in op by name; a problem file by its content (the same file elsewhere is the same)."""
    path = Path(ref)
    if path.suffix == ".py" and path.is_file():
        return "file:" + hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    return ref


def key(machine: dict[str, str], ref: str, dtype: str, m: int, n: int, baseline: str) -> str:
    soft = {k: machine.get(k, "") for k in ("gpu", "torch", "cuda", "triton", "quack", "liger_kernel")}
    return json.dumps([soft, problem_id(ref), dtype, m, n, baseline], sort_keys=True)


class BaselineCache:
    def __init__(self, path: Path | None = None, max_age_s: float = MAX_AGE_S) -> None:
        self.path = path or default_path()
        self.max_age_s = max_age_s

    def _read(self) -> dict[str, Any]:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}

    def lookup(self, keys: dict[str, str]) -> dict[str, dict[str, float]]:
        """The entries (ms, tbs, t) of `keys` (name -> key) that exist and are young enough."""
        data, now = self._read(), time.time()
        return {name: e for name, k in keys.items() if (e := data.get(k)) and now - e.get("t", 0) <= self.max_age_s}

    def store(self, entries: dict[str, dict[str, float]]) -> None:
        """Add entries (key -> {ms, tbs, t}); a cache that cannot be written costs time, nothing else."""
        if not entries:
            return
        try:
            data = self._read()
            data.update(entries)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=0))
            tmp.replace(self.path)
        except OSError:
            pass


class NoBaselineCache(BaselineCache):
    """Times every baseline every time (`--fresh-baselines`)."""

    def lookup(self, keys: dict[str, str]) -> dict[str, dict[str, float]]:
        return {}
