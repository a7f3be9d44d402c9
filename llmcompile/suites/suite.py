"""A suite file: which problems an eval runs and with what budget.

name = "membound"
target = "h100"
baselines = ["eager", "compile", "quack", "liger"]

[budget]            # per problem; each [[problem]] may override any key
rounds = 4
samples = 4
max_tokens = 0      # 0: no limit
time_s = 900        # 0: no limit
target_sol = 90

[[problem]]
op = "softmax"                   # a built-in op ...
dtypes = ["bfloat16", "float32"]
shapes = ["32768x4096"]          # optional; default: the op's benchmark grid

[[problem]]
dir = "problems"                 # ... or every KernelBench-format file in a directory
                                 # (relative to the suite file), or file = "x.py"
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from llmcompile.specs import BUILTIN, OpError, dtype_name, get_op, parse_shape
from llmcompile.specs.targets import DEFAULT_TARGET, TargetError, get_target

SHORT_DTYPE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


class SuiteError(ValueError):
    pass


@dataclass(frozen=True)
class Budget:
    rounds: int = 4
    samples: int = 4
    max_tokens: int = 0
    time_s: float = 0.0
    target_sol: float = 90.0


@dataclass(frozen=True)
class Problem:
    id: str  # unique in the suite: <op>-<dtype>
    op: str  # a built-in name or a problem file path (OpSpec.ref)
    dtype: str
    budget: Budget
    shapes: tuple[tuple[int, int], ...] = ()  # empty: the op's own benchmark shapes
    custom: bool = False  # a KernelBench-format file: needs an LLM, the offline search cannot do it


@dataclass(frozen=True)
class Suite:
    name: str
    path: str
    target: str
    baselines: tuple[str, ...]
    problems: tuple[Problem, ...] = field(default_factory=tuple)


_TOP = {"name", "target", "baselines", "budget", "problem"}
_ENTRY = {"op", "dir", "file", "exclude", "dtypes", "shapes", "budget"}


def _budget(raw: Any, base: Budget, where: str) -> Budget:
    if raw is None:
        return base
    if not isinstance(raw, dict):
        raise SuiteError(f"{where}: budget must be a table")
    known = {f.name for f in fields(Budget)}
    bad = set(raw) - known
    if bad:
        raise SuiteError(f"{where}: unknown budget keys {sorted(bad)}; known: {sorted(known)}")
    try:
        return replace(base, **{k: type(getattr(base, k))(v) for k, v in raw.items()})
    except (TypeError, ValueError) as e:
        raise SuiteError(f"{where}: bad budget value: {e}") from None


def _shapes(raw: Any, where: str) -> tuple[tuple[int, int], ...]:
    try:
        return tuple(parse_shape(s) for s in raw or [])
    except OpError as e:
        raise SuiteError(f"{where}: {e}") from None


def load_suite(path: str | Path, problems_dir: str | Path | None = None) -> Suite:
    """`problems_dir` replaces every `dir` entry's directory (a KernelBench checkout elsewhere)."""
    path = Path(path)
    if not path.is_file():
        raise SuiteError(f"no such suite file: {path}")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise SuiteError(f"{path}: not valid TOML: {e}") from None
    bad = set(raw) - _TOP
    if bad:
        raise SuiteError(f"{path}: unknown keys {sorted(bad)}; known: {sorted(_TOP)}")
    target = str(raw.get("target", DEFAULT_TARGET))
    try:
        get_target(target)
    except TargetError as e:
        raise SuiteError(f"{path}: {e}") from None
    budget = _budget(raw.get("budget"), Budget(), f"{path} [budget]")
    problems: list[Problem] = []
    entries = raw.get("problem", [])
    if not entries:
        raise SuiteError(f"{path}: no [[problem]] entries")
    for i, e in enumerate(entries):
        where = f"{path} problem {i + 1}"
        bad = set(e) - _ENTRY
        if bad:
            raise SuiteError(f"{where}: unknown keys {sorted(bad)}; known: {sorted(_ENTRY)}")
        kinds = [k for k in ("op", "dir", "file") if k in e]
        if len(kinds) != 1:
            raise SuiteError(f"{where}: give exactly one of op, dir or file")
        b = _budget(e.get("budget"), budget, where)
        shapes = _shapes(e.get("shapes"), where)
        if "op" in e:
            if e["op"] not in BUILTIN:
                raise SuiteError(f"{where}: unknown op {e['op']!r}; built-ins: {', '.join(sorted(BUILTIN))}")
            refs = [e["op"]]
        elif "dir" in e:
            d = Path(problems_dir) if problems_dir else path.parent / e["dir"]
            if not d.is_dir():
                hint = "" if problems_dir else " (give another with --problems DIR)"
                raise SuiteError(f"{where}: no such problem directory {d}{hint}")
            skip = set(e.get("exclude", ()))
            refs = [
                str(p.resolve()) for p in sorted(d.glob("*.py")) if not p.name.startswith("_") and p.name not in skip
            ]
            if not refs:
                raise SuiteError(f"{where}: no problem files in {d}")
        else:
            f = path.parent / e["file"]
            refs = [str(f.resolve())]
        for ref in refs:
            try:
                spec = get_op(ref)
                dtypes = [dtype_name(d) for d in e.get("dtypes", spec.dtypes[:1])]
            except OpError as err:
                raise SuiteError(f"{where}: {err}") from None
            for d in dtypes:
                if d not in spec.dtypes:
                    raise SuiteError(f"{where}: {spec.name} does not take {d}; it takes {', '.join(spec.dtypes)}")
                pid = f"{spec.name}-{SHORT_DTYPE[d]}"
                problems.append(Problem(pid, spec.ref, d, b, shapes, custom=spec.source_path is not None))
    ids = [p.id for p in problems]
    dup = sorted({x for x in ids if ids.count(x) > 1})
    if dup:
        raise SuiteError(f"{path}: problems listed twice: {', '.join(dup)}")
    baselines = tuple(raw.get("baselines", ("eager", "compile")))
    from llmcompile.bench.baselines import BASELINES

    if unknown := [b for b in baselines if b not in BASELINES]:
        raise SuiteError(f"{path}: unknown baselines {unknown}; known: {', '.join(BASELINES)}")
    return Suite(str(raw.get("name", path.stem)), str(path.resolve()), target, baselines, tuple(problems))
