"""`load(best_dir)`: a run's winning kernel as a torch function (and torch.library op).

It loads the sealed artifact (`best/artifact/`: the object files the judge verified and timed,
checked against their manifest's hashes); the candidate's Python source is never imported.
"""

from __future__ import annotations

from pathlib import Path

from llmcompile.harness import artifact
from llmcompile.kernels import KernelFunction
from llmcompile.ops import get_op

_LOADED: dict[str, KernelFunction] = {}


def load(best_dir: str | Path) -> KernelFunction:
    d = Path(best_dir)
    art = d / "artifact" if (d / "artifact").is_dir() else d
    if not (art / "manifest.json").is_file():
        raise FileNotFoundError(f"{d} holds no kernel artifact (best/artifact/manifest.json or manifest.json)")
    man = artifact.read(art)
    key = artifact.sha256((art / "manifest.json").read_bytes())[:10]
    if key in _LOADED:
        return _LOADED[key]
    spec = get_op(man.op)
    _, fns = artifact.load_functions(art)
    safe = "".join(c if c.isalnum() else "_" for c in spec.name)
    pre = {(man.dtype, n): fn for n, fn in fns.items()}
    fn = KernelFunction(spec, None, op_name=f"best_{safe}_{key}", precompiled=pre)
    _LOADED[key] = fn
    return fn
