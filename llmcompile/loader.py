"""`load(best_dir)`: a run's winning kernel as a torch function (and torch.library op)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from llmcompile import contract
from llmcompile.kernels import KernelFunction
from llmcompile.ops import get_op

_LOADED: dict[str, KernelFunction] = {}


def load(best_dir: str | Path) -> KernelFunction:
    d = Path(best_dir)
    meta_path, src_path = d / "meta.json", d / "kernel.py"
    if not meta_path.is_file() or not src_path.is_file():
        raise FileNotFoundError(f"{d} is not a run's best/ directory (needs kernel.py and meta.json)")
    meta = json.loads(meta_path.read_text())
    sha = hashlib.sha256(src_path.read_bytes()).hexdigest()[:10]
    if sha in _LOADED:
        return _LOADED[sha]
    spec = get_op(meta["op_ref"])
    contract.ensure_arch()
    entry = contract.entry_of(contract.load_module(src_path))
    safe = "".join(c if c.isalnum() else "_" for c in spec.name)
    fn = KernelFunction(spec, entry, op_name=f"best_{safe}_{sha}")
    _LOADED[sha] = fn
    return fn
