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
    static_smem_bytes: int = 0  # ptxas's count (`__shared__` arrays)
    dynamic_smem_bytes: int | None = None  # what the host launches it with; None: not a constant
    threads: int | None = None  # per CTA, from the launch; None: not a constant

    @property
    def smem_bytes(self) -> int | None:
        return None if self.dynamic_smem_bytes is None else self.static_smem_bytes + self.dynamic_smem_bytes

    def residency(self, smem_per_sm_kb: int) -> tuple[int, str] | None:
        """CTAs one SM can hold at once and what limits it, by Hopper's allocation rules
        (registers by 256 a warp out of 64K, 1 KB of shared memory reserved per CTA, at most
        2048 threads and 32 CTAs); None when the launch is not known at compile time."""
        if self.threads is None or self.smem_bytes is None:
            return None
        warps = -(-self.threads // 32)
        regs_per_warp = -(-max(self.registers, 1) * 32 // 256) * 256
        limits = {
            "registers": (65536 // regs_per_warp) // warps,
            "shared memory": (smem_per_sm_kb * 1024) // (self.smem_bytes + 1024),
            "threads": 2048 // (warps * 32),
            "CTA slots": 32,
        }
        limiter = min(limits, key=lambda k: limits[k])
        return limits[limiter], limiter

    def describe(self, smem_per_sm_kb: int) -> str:
        """One line for people and for the LLM's feedback."""
        text = f"{self.registers} registers, {self.spill_store_bytes} B spilled"
        if self.smem_bytes is not None:
            text += f", {self.smem_bytes} B shared memory"
        if self.threads is not None:
            text += f", {self.threads} threads"
        if (res := self.residency(smem_per_sm_kb)) is not None:
            text += f": {res[0]} CTA{'s' if res[0] != 1 else ''} per SM (limit: {res[1]})"
        return text


@dataclass
class CompileResult:
    ok: bool
    n: list[int] = field(default_factory=list)  # the N compiled for
    error: str = ""  # trimmed: the candidate's failing line and the message
    kernels: list[KernelResources] = field(default_factory=list)  # of the largest N
    seconds: float = 0.0
    workspace: int = 0  # fp32 elements of scratch the kernel asks for (kernel contract, rule 6)
    kernels_by_n: dict[int, list[KernelResources]] = field(default_factory=dict)  # every N's
    cached: list[int] = field(default_factory=list)  # the N whose sealed kernel came from the compile cache


@dataclass
class CheckFailure:
    # mismatch | unwritten | input_modified | input_write | out_of_bounds_write | stale | nondeterministic | error
    # | timed_output
    check: str
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
    # KernelBench's own verdict on the same outputs (verify.KernelBenchTally.as_dict)
    kernelbench: dict[str, Any] = field(default_factory=dict)
    read_only: bool = False  # the inputs were in read-only device memory during every call
    case_seconds: dict[str, float] = field(default_factory=dict)  # "MxN case/seed" -> its seconds


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
    # impl -> seconds since a baseline was timed, for those taken from the judge's baseline cache
    # (harness/baseline_cache.py) rather than timed beside this candidate
    baseline_age_s: dict[str, float] = field(default_factory=dict)
    # impl -> the flag a baseline's own timing carried (shown with it, never cached)
    baseline_notes: dict[str, str] = field(default_factory=dict)


@dataclass
class ProfileResult:
    ok: bool
    sol_tbs: float = 0.0  # the device copy bandwidth measured in the same process
    read_tbs: float = 0.0  # a read-only stream, the ceiling for ops that write almost nothing
    shapes: list[ShapeTiming] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    seconds: float = 0.0
    failure: CheckFailure | None = None  # what the timed calls wrote was wrong
    kernelbench: dict[str, Any] = field(default_factory=dict)  # its verdict on the timed outputs
    # What sol_tbs, read_tbs and every shape's tbs count: "TFLOP/s" for a compute-bound op,
    # whose SOL is the dense GEMM throughput measured beside it
    unit: str = "TB/s"
    # what each shape's timed outputs were checked against (verify.check_method)
    checks: list[str] = field(default_factory=list)
    # what the judge's own copy showed right after the baselines were timed on a GPU not its alone
    # ("" where it was its alone): those baselines are shown, not cached
    disturbed: str = ""
    read_only: bool = False  # the inputs were in read-only device memory while the candidate was timed
    # where `seconds` went: making the input sets, the candidate's timing, each baseline's (its
    # making too), the checks of what the timed calls wrote, settle and calm waits, "other"
    phases_s: dict[str, float] = field(default_factory=dict)

    @property
    def limit(self) -> str:
        return "dense GEMM" if self.unit != "TB/s" else "device copy"

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
    artifact: str | None = None  # the sealed kernel's directory (what was verified and timed)
    # seconds in each of the judge's steps for this candidate: static, compile (the wall time of
    # its parallel compile processes), seal, gpu_wait (sealed, waiting for the GPU worker: its
    # start-up, or the candidates before it), load (the problem and the kernel in the GPU worker),
    # verify, profile, attribute (verifying again after a fault); `Judge` fills it
    timeline: dict[str, float] = field(default_factory=dict)
    finished_at: float = 0.0  # time.time() when the judge reached this verdict

    @property
    def passed(self) -> bool:
        return self.status in PASSING

    def resources(self, kernels: int = 2) -> list[str]:
        """What ptxas and the launch say about the first `kernels` kernels, one line each."""
        from llmcompile.specs.targets import get_target

        smem_kb = get_target(self.target).smem_per_sm_kb if self.target else 228
        return [k.describe(smem_kb) for k in (self.compile.kernels if self.compile else [])[:kernels]]

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
            c["kernels_by_n"] = {
                int(n): [KernelResources(**k) for k in ks] for n, ks in c.get("kernels_by_n", {}).items()
            }
            d["compile"] = CompileResult(**c)
        if d.get("verify"):
            v = dict(d["verify"])
            v["shapes"] = [tuple(s) for s in v.get("shapes", [])]
            v["failure"] = CheckFailure(**v["failure"]) if v.get("failure") else None
            d["verify"] = VerifyResult(**v)
        if d.get("profile"):
            p = dict(d["profile"])
            p["shapes"] = [ShapeTiming(**s) for s in p.get("shapes", [])]
            p["failure"] = CheckFailure(**p["failure"]) if p.get("failure") else None
            d["profile"] = ProfileResult(**p)
        return cls(**d)
