"""The run store: one directory per agent run, written as it goes, so nothing is lost.

config.json        what was asked (op, dtype, target, provider, budgets)
versions.json      torch, CuTe DSL, driver, GPU
transcript.jsonl   every prompt, answer and feedback, in order (replay reads it)
timeline.jsonl     one line per event (round start, candidate judged, stop)
candidates/        c<round>_<sample>.py and .json (the source and its verdict)
state.json         where the loop is (round, conversations, usage): --resume reads it
sandbox.json       the isolation candidates ran under (layers; whether --unsafe-no-sandbox was used)
best/              the winning kernel: artifact/ (the sealed object files and manifest that were
                   verified and timed; llmcompile.load), kernel.py (its source), report.md, plot.png
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llmcompile.harness.verdict import Verdict
from llmcompile.runtime import library
from llmcompile.runtime.artifact import ArtifactError

BEST_INIT = '''"""Best kernel of an llmcompile run: `from llmcompile import load; fn = load(this directory)`,
or import this package: it exposes `{name}` (a torch function, registered as a torch.library op)."""

from pathlib import Path

from llmcompile.loader import load

{name} = load(Path(__file__).parent)
'''


def process_started() -> float:
    """When this process started (time.time()'s clock), from /proc: a run's timeline counts the
    interpreter's start and the imports too. Now, where /proc cannot say."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


def write_json_atomic(path: Path, data: Any) -> None:
    """Write through a temporary file and rename: an interrupt never leaves half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


@dataclass
class RunConfig:
    op: str  # built-in name or KernelBench file path
    dtype: str
    target: str
    provider: str
    model: str = ""
    base_url: str = ""
    samples: int = 4
    rounds: int = 6
    max_tokens: int = 0  # total tokens for the run; 0: no limit
    time_limit_s: float = 0.0  # 0: no limit
    target_pct: float = 90.0
    compile_only: bool = False
    baselines: list[str] = field(default_factory=lambda: ["eager", "compile", "quack", "liger"])
    replay_from: str = ""
    shapes: list[list[int]] = field(default_factory=list)  # benchmark [M, N]s; empty: the op's own

    def profile_shapes(self) -> list[tuple[int, int]] | None:
        return [(int(m), int(n)) for m, n in self.shapes] or None


class RunStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        (path / "candidates").mkdir(parents=True, exist_ok=True)
        self._cache: dict[str, dict[str, Any]] = {}
        for f in (path / "candidates").glob("*.json"):
            rec = json.loads(f.read_text())
            self._cache[rec["key"]] = rec

    # ------------------------------------------------------------------ writing

    def _append(self, name: str, rec: dict[str, Any]) -> None:
        with open(self.path / name, "a") as fh:
            fh.write(json.dumps({"t": time.time(), **rec}) + "\n")

    def write_json(self, name: str, data: Any) -> None:
        write_json_atomic(self.path / name, data)

    def transcript(self, **rec: Any) -> None:
        self._append("transcript.jsonl", rec)

    def event(self, event: str, **rec: Any) -> None:
        self._append("timeline.jsonl", {"event": event, **rec})

    def save_candidate(self, cid: str, key: str, source: str, verdict: Verdict, round_: int, sample: int) -> None:
        (self.path / "candidates" / f"{cid}.py").write_text(source)
        rec = {"id": cid, "key": key, "round": round_, "sample": sample, "verdict": verdict.to_json()}
        self.write_json(f"candidates/{cid}.json", rec)
        self._cache[key] = rec

    # ------------------------------------------------------------------ reading

    def cached_verdict(self, key: str) -> Verdict | None:
        rec = self._cache.get(key)
        return Verdict.from_json(rec["verdict"]) if rec else None

    def recorded_answers(self) -> dict[tuple[int, int], dict[str, Any]]:
        path = self.path / "transcript.jsonl"
        if not path.is_file():
            return {}
        out = {}
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("kind") == "answer":
                out[(rec["round"], rec["sample"])] = rec
        return out

    def events(self) -> list[dict[str, Any]]:
        path = self.path / "timeline.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []

    def candidates(self) -> list[dict[str, Any]]:
        recs = [json.loads(f.read_text()) for f in (self.path / "candidates").glob("*.json")]
        return sorted(recs, key=lambda r: (r["round"], r["sample"]))

    def load_state(self) -> dict[str, Any] | None:
        p = self.path / "state.json"
        return json.loads(p.read_text()) if p.is_file() else None

    def config(self) -> RunConfig:
        return RunConfig(**json.loads((self.path / "config.json").read_text()))

    # ------------------------------------------------------------------ best

    def sandbox(self) -> dict[str, Any]:
        p = self.path / "sandbox.json"
        return json.loads(p.read_text()) if p.is_file() else {}

    def write_best(self, op_name: str, source: str, meta: dict[str, Any], artifact: str | None) -> Path:
        best = self.path / "best"
        best.mkdir(exist_ok=True)
        if artifact is not None:  # byte for byte what the judge verified and timed
            shutil.rmtree(best / "artifact", ignore_errors=True)
            shutil.copytree(artifact, best / "artifact")
            try:  # and those objects linked into a library that loads without CuTe DSL
                library.link(best / "artifact")
            except (ArtifactError, OSError) as e:
                meta = {**meta, "library": f"not linked: {e}"}
        (best / "kernel.py").write_text(source)
        (best / "meta.json").write_text(json.dumps(meta, indent=1))
        ident = "".join(c if c.isalnum() else "_" for c in op_name)
        (best / "__init__.py").write_text(BEST_INIT.format(name=ident))
        return best


def new_run_dir(root: Path, op_name: str, target: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = root / f"{op_name}-{target}-{stamp}"
    i = 1
    while path.exists():
        path = root / f"{op_name}-{target}-{stamp}-{i}"
        i += 1
    return path


def config_dict(cfg: RunConfig) -> dict[str, Any]:
    return asdict(cfg)
