"""A fresh process that cannot import CuTe DSL loads an exported kernel and calls it once (GPU).

    python -m evals.scripts.fresh_load DIR

Any import of `cutlass` (CuTe DSL) fails in this process, so the load can only go through
TVM-FFI. Prints the seconds from `load(DIR)` to the first call's result (synchronized), and
whether that result matches torch on the same input.
"""

from __future__ import annotations

import importlib.abc
import json
import sys
import time
from pathlib import Path


class NoCuteDSL(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):  # noqa: ANN001, ANN201 - the import protocol's
        if name.split(".")[0] in ("cutlass", "nvidia_cutlass_dsl"):
            raise ImportError(f"{name}: this process runs without CuTe DSL")
        return None


def main(directory: str) -> int:
    sys.meta_path.insert(0, NoCuteDSL())
    import torch
    import torch.nn.functional as F

    man = json.loads((Path(directory) / "manifest.json").read_text())
    op, n = man["op"], int(min(man["symbols"], key=int))
    x = torch.randn(8, n, device="cuda", dtype=torch.bfloat16)
    w = torch.rand(n, device="cuda", dtype=torch.bfloat16) + 0.5
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    t = torch.randint(0, n, (8,), device="cuda")
    args = {"softmax": (x,), "rmsnorm": (x, w), "layernorm": (x, w, b), "cross_entropy": (x, t)}[op]
    torch.cuda.synchronize()  # CUDA context creation is the process's, not the kernel's
    t0 = time.perf_counter()
    from llmcompile.loader import load

    y = load(directory)(*args)
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    xf = x.float()
    want = {
        "softmax": lambda: torch.softmax(xf, -1),
        "rmsnorm": lambda: F.rms_norm(xf, (n,), w.float(), eps=1e-6),
        "layernorm": lambda: F.layer_norm(xf, (n,), w.float(), b.float(), eps=1e-5),
        "cross_entropy": lambda: F.cross_entropy(xf, t, reduction="none"),
    }[op]()
    err = (y.float() - want).abs().max().item()
    cute = any(m.split(".")[0] == "cutlass" for m in sys.modules)
    print(f"first call {first:.3f} s after load() began; max |error| vs torch fp32 {err:.3g}; cutlass imported: {cute}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
