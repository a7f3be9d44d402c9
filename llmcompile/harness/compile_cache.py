"""Sealed kernels by what they were compiled from: the same source, signature, dtype, N, target
architecture and CuTe DSL version compile to the same object, so the judge compiles and seals each
once, across candidates, runs and evals.

One directory an entry, named by the hash of those inputs, under `default_root()`:
    n.o          the sealed object (runtime/seal.py's output), hashed in entry.json
    entry.json   the launches, the ptxas resources of this N's kernels, the workspace asked for

Only the judge writes here, after sealing, never the sandboxed compile step. An entry that does
not read back whole (a crash mid-write, a hash that does not match) is a miss, never an error.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llmcompile.harness.verdict import KernelResources
from llmcompile.runtime.artifact import FORMAT, cute_dsl_version, sha256


def default_root() -> Path:
    base = Path(os.environ.get("LLMCOMPILE_CACHE", Path.home() / ".cache" / "llmcompile"))
    return base / "compiled"


@functools.cache
def _judge_code() -> str:
    """The hash of the code that compiles and seals (the compile step, the sealer, the artifact
    format): an entry made before a change to how kernels are audited or exported is not used after it."""
    pkg = Path(__file__).parents[1]
    files = (
        "harness/compiler.py",
        "harness/candidate.py",
        "runtime/artifact.py",
        "runtime/seal.py",
        "runtime/launches.py",
    )
    return sha256(b"".join((pkg / f).read_bytes() for f in files))


@functools.cache
def _kernels_code() -> str:
    """The hash of the reference kernels a candidate may import (the row template, its tuned
    tables, the op modules): a kernel built on them compiles to something else when they change,
    though its own source does not."""
    return tree_hash(Path(importlib.util.find_spec("reference_kernels").origin).parent)  # type: ignore[union-attr, arg-type]


def tree_hash(root: Path) -> str:
    """The hash of the Python sources under `root`, with their paths."""
    files = sorted(root.rglob("*.py"))
    return sha256(b"".join(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() for f in files))


def key(source: str, signature: dict[str, Any], dtype: str, n: int, arch: str) -> str:
    blob = json.dumps(
        [FORMAT, _judge_code(), _kernels_code(), cute_dsl_version(), arch, sha256(source.encode()), signature, dtype, n]
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


@dataclass
class Entry:
    obj: bytes
    launches: dict[str, list[int]]
    kernels: list[KernelResources] = field(default_factory=list)
    workspace: int = 0


class CompileCache:
    def __init__(self, root: Path | None = None) -> None:
        self.root = root or default_root()

    def get(self, k: str) -> Entry | None:
        d = self.root / k
        try:
            meta = json.loads((d / "entry.json").read_text())
            obj = (d / "n.o").read_bytes()
        except (OSError, ValueError):
            return None
        if sha256(obj) != meta.get("sha256"):
            return None
        kernels = [KernelResources(**r) for r in meta.get("kernels", [])]
        return Entry(obj, meta["launches"], kernels, int(meta.get("workspace", 0)))

    def put(self, k: str, entry: Entry) -> None:
        """Write through a temporary directory and rename: readers see a whole entry or none."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=self.root, prefix=".tmp-"))
            (tmp / "n.o").write_bytes(entry.obj)
            meta = {
                "sha256": sha256(entry.obj),
                "launches": entry.launches,
                "kernels": [asdict(r) for r in entry.kernels],
                "workspace": entry.workspace,
            }
            (tmp / "entry.json").write_text(json.dumps(meta))
            try:
                tmp.rename(self.root / k)
            except OSError:  # another process wrote the same entry first: theirs is as good
                shutil.rmtree(tmp, ignore_errors=True)
        except OSError:
            pass  # a cache that cannot be written costs time, never a verdict


class NoCache(CompileCache):
    """Compiles every time: for measuring the compile itself (evals/scripts/sandbox_overhead.py)."""

    def get(self, k: str) -> Entry | None:
        return None

    def put(self, k: str, entry: Entry) -> None:
        pass
