"""`load(directory)`: a kernel artifact (a run's `best/`, or what `llmcompile export` wrote) as a
torch function, and a torch.library op.

An artifact with a linked library (`kernels.so`) loads through TVM-FFI alone: no CuTe DSL, no
compile, no Python of the candidate. One with object files only (a judge's artifact) loads them
through CuTe DSL's runtime. Either way, the bytes are checked against the manifest's hashes.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from llmcompile.runtime import artifact
from llmcompile.runtime.callpath import KernelFunction
from llmcompile.runtime.callspec import CallSpec

_LOADED: dict[str, KernelFunction] = {}
_MODULES: list[Any] = []  # TVM-FFI modules whose functions are in use


def load(directory: str | Path) -> KernelFunction:
    d = Path(directory)
    art = d / "artifact" if (d / "artifact").is_dir() else d
    if not (art / "manifest.json").is_file():
        raise FileNotFoundError(f"{d} holds no kernel artifact (best/artifact/manifest.json or manifest.json)")
    man = artifact.read(art)
    key = artifact.sha256((art / "manifest.json").read_bytes())[:10]
    if key in _LOADED:
        return _LOADED[key]
    if man.call:  # the call, restricted to the artifact's one dtype
        spec: Any = replace(CallSpec.from_json(man.call), dtypes=(man.dtype,))
    else:  # an artifact from before manifests carried the call: the op must be known here
        from llmcompile.specs import get_op

        spec = get_op(man.op)
    if man.library:
        from llmcompile.runtime import library

        _, fns, module = library.load_functions(art)
        _MODULES.append(module)
    else:
        _, fns = artifact.load_functions(art)
    safe = "".join(c if c.isalnum() else "_" for c in spec.name)
    pre = {(man.dtype, n): fn for n, fn in fns.items()}
    fn = KernelFunction(spec, None, op_name=f"best_{safe}_{key}", precompiled=pre)
    _LOADED[key] = fn
    return fn
