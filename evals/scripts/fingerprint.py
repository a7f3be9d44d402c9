"""What a refactor must not change, as hashes: every reference kernel's PTX at a few N (names made
from module paths and content hashes masked) and every KernelBench level-1 kernel the matcher
renders (byte for byte).

    python -m evals.scripts.fingerprint OUT.json [--level1 DIR] [--ns 1024,5001,65536,262144]
    python -m evals.scripts.fingerprint --compare BEFORE.json AFTER.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import tempfile
from pathlib import Path

LEVEL1 = Path(__file__).resolve().parents[3] / "shared" / "kernelbench" / "level1"
# a module's content hash and the object addresses CuTe DSL writes into kernel names
_NAMES = re.compile(r"llmcompile_kernel_[0-9a-f]+|_object_at_[0-9a-zA-Z_]+?(?=_tensor|_Fake|_Tiled|\()|0x[0-9a-f]{6,}")


def _ptx_hash(entry, spec, dtype: str, n: int, workspace: int) -> str:
    from llmcompile.specs import contract

    with tempfile.TemporaryDirectory() as d:
        contract.compile_entry(entry, spec, dtype, n, options=f"--keep-ptx --dump-dir={d}", workspace=workspace)
        texts = sorted(_NAMES.sub("X", p.read_text()) for p in Path(d).rglob("*.ptx"))
    lines = [ln for t in texts for ln in t.splitlines() if not ln.startswith("//")]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def ptx(ns: list[int]) -> dict[str, str]:
    import importlib

    from llmcompile.specs import BUILTIN, contract

    out = {}
    for op, spec in sorted(BUILTIN.items()):
        mod = importlib.import_module(f"reference_kernels.{spec.reference_module}")
        entry = contract.entry_of(mod)
        for dtype in [d for d in ("bfloat16", "float32") if d in spec.dtypes]:
            for n in ns if not spec.compute_bound else [spec.shapes()[0][1]]:
                key = f"{op}/{dtype}/{n}"
                try:
                    out[key] = _ptx_hash(entry, spec, dtype, n, contract.workspace_of(mod))
                except Exception as e:  # noqa: BLE001 - a config that does not compile is a fingerprint too
                    out[key] = f"error: {type(e).__name__}"
                print(key, out[key], file=sys.stderr)
    return out


def rendered(level1: Path) -> dict[str, str]:
    from llmcompile.agent import patterns
    from llmcompile.specs.kernelbench import load_problem

    out = {}
    for f in sorted(level1.glob("*.py")):
        m = patterns.match(load_problem(f))
        out[f.name] = (
            f"{m.pattern}:{hashlib.sha256(m.source.encode()).hexdigest()[:16]}"
            if isinstance(m, patterns.Match)
            else f"no match: {m.reason}"
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?")
    ap.add_argument("--level1", default=str(LEVEL1))
    ap.add_argument("--ns", default="1024,5001,65536,262144")
    ap.add_argument("--compare", nargs=2)
    args = ap.parse_args()
    if args.compare:
        a, b = (json.loads(Path(p).read_text()) for p in args.compare)
        diff = {k: (a[s].get(k), b[s].get(k)) for s in a for k in set(a[s]) | set(b[s]) if a[s].get(k) != b[s].get(k)}
        print(json.dumps(diff, indent=1) if diff else f"identical: {sum(len(v) for v in a.values())} fingerprints")
        sys.exit(1 if diff else 0)
    from llmcompile.specs import contract

    contract.ensure_arch()
    data = {"rendered": rendered(Path(args.level1)), "ptx": ptx([int(n) for n in args.ns.split(",")])}
    Path(args.out).write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
