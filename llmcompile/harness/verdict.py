"""What the judge says about a candidate: one dataclass per stage, and the Verdict over them.

All plain dataclasses that round-trip through JSON, so workers, the agent loop, the run store
and reports pass the same records.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

STAGES = ("static", "compile", "verify", "profile")

# Verdict statuses, worst first. A candidate is usable only when it `passed`.
STATIC_REJECTED = "static_rejected"
COMPILE_ERROR = "compile_error"
CRASHED = "crashed"
TIMEOUT = "timeout"
WRONG = "wrong"
SUSPICIOUS = "suspicious"  # profiled faster than physics allows: a timing exploit or a bug
COMPILED = "compiled"  # passed every stage asked for, which stopped after compile
VERIFIED = "verified"  # ... stopped after verify
PROFILED = "profiled"  # passed all four stages
PASSING = (COMPILED, VERIFIED, PROFILED)


@dataclass
class StaticResult:
    ok: bool
    problems: list[str] = field(default_factory=list)  # each with its line number


@dataclass
class KernelResources:
    name: str
    registers: int
    spill_store_bytes: int
    spill_load_bytes: int
    stack_bytes: int
    barriers: int


@dataclass
class CompileResult:
    ok: bool
    n: list[int] = field(default_factory=list)  # the N compiled for
    error: str = ""  # trimmed: the candidate's failing line and the message
    kernels: list[KernelResources] = field(default_factory=list)  # of the largest N
    seconds: float = 0.0


@dataclass
class CheckFailure:
    check: str  # mismatch | unwritten | input_modified | out_of_bounds_write | stale | nondeterministic | error
    m: int
    n: int
    case: str
    seed: int
    detail: str

    def describe(self) -> str:
        return f"[{self.check}] at M={self.m} N={self.n} ({self.case} inputs, seed {self.seed}): {self.detail}"


@dataclass
class VerifyResult:
    ok: bool
    runs: int = 0
    shapes: list[tuple[int, int]] = field(default_factory=list)
    failure: CheckFailure | None = None
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class ShapeTiming:
    m: int
    n: int
    ms: float
    tbs: float
    pct_sol: float
    graph: bool
    baselines: dict[str, float] = field(default_factory=dict)  # impl -> TB/s
    baseline_ms: dict[str, float] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)


@dataclass
class ProfileResult:
    ok: bool
    sol_tbs: float = 0.0  # the device copy bandwidth measured in the same process
    read_tbs: float = 0.0  # a read-only stream, the ceiling for ops that write almost nothing
    shapes: list[ShapeTiming] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def min_pct_sol(self) -> float:
        return min((s.pct_sol for s in self.shapes), default=0.0)


@dataclass
class Verdict:
    status: str
    message: str  # what an LLM (or a person) should read first
    op: str
    dtype: str
    target: str
    source_sha: str
    static: StaticResult | None = None
    compile: CompileResult | None = None
    verify: VerifyResult | None = None
    profile: ProfileResult | None = None
    wall_s: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status in PASSING

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Verdict:
        d = dict(d)
        if d.get("static"):
            d["static"] = StaticResult(**d["static"])
        if d.get("compile"):
            c = dict(d["compile"])
            c["kernels"] = [KernelResources(**k) for k in c.get("kernels", [])]
            d["compile"] = CompileResult(**c)
        if d.get("verify"):
            v = dict(d["verify"])
            v["shapes"] = [tuple(s) for s in v.get("shapes", [])]
            v["failure"] = CheckFailure(**v["failure"]) if v.get("failure") else None
            d["verify"] = VerifyResult(**v)
        if d.get("profile"):
            p = dict(d["profile"])
            p["shapes"] = [ShapeTiming(**s) for s in p.get("shapes", [])]
            d["profile"] = ProfileResult(**p)
        return cls(**d)
