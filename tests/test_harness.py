"""CPU (CI): the judge's static check, compile diagnostics and worker isolation."""

from __future__ import annotations

import importlib.resources
import time
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import pytest

from llmcompile.harness import COMPILE_ERROR, CRASHED, STATIC_REJECTED, WRONG, Judge, JudgeOptions, static
from llmcompile.harness.compiler import parse_ptxas, with_launches
from llmcompile.harness.judge import _finish
from llmcompile.harness.sandbox import ROOT, Layers, Sandbox, sandbox
from llmcompile.harness.verdict import CheckFailure, KernelResources, Verdict
from llmcompile.harness.worker import CandidatePool, Channel, JobOutcome
from llmcompile.runtime.launches import parse_launches
from llmcompile.specs import BUILTIN, contract, get_op
from reference_kernels.reduce import RowKnobs, resolve_tiling
from tests.bad_kernels import BAD, BASE, HONEST

REF = Path(__file__).resolve().parents[1] / "reference_kernels"


@pytest.mark.parametrize("op", sorted(BUILTIN))
def test_reference_kernels_pass_static_check(op: str) -> None:
    res = static.check_source((REF / f"{BUILTIN[op].reference_module}.py").read_text())
    assert res.ok, res.problems


@pytest.mark.parametrize("path", sorted(REF.rglob("*.py")), ids=lambda p: str(p.relative_to(REF)))
def test_what_a_reference_kernel_imports_a_candidate_may_import(path: Path) -> None:
    """A kernel built like ours imports the modules ours import (the row template's parts, the
    tuned tables): the static check must let a candidate import each, or it rejects an honest
    kernel (the offline default's own variants are such candidates)."""
    import ast

    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if (
                name.startswith("reference_kernels.")
                and (REF / f"{name.split('.', 1)[1].replace('.', '/')}.py").exists()
            ):
                assert static._module_allowed(name), f"{path.name} imports {name}, which a candidate may not"


def test_base_bad_kernel_is_clean() -> None:
    assert static.check_source(BASE).ok


@pytest.mark.parametrize(
    "snippet, why",
    [
        ("import numpy as np\n", "numpy"),
        ("import os\n", "os"),
        ("from subprocess import run\n", "subprocess"),
        ("x = open('/etc/passwd')\n", "open"),
        ("x = eval('1')\n", "eval"),
        ("import importlib\n", "importlib"),
        ("x = (1).__class__.__subclasses__()\n", "__class__"),
        ("global FOO\n", "global"),
        ("from . import sibling\n", "from ."),
        ("import socket\n", "socket"),
    ],
)
def test_static_check_refuses(snippet: str, why: str) -> None:
    res = static.check_source(BASE + snippet)
    assert not res.ok
    assert any(why.split()[0].strip(".") in p for p in res.problems), res.problems


def test_static_check_reports_syntax_error_line() -> None:
    res = static.check_source("def f(:\n")
    assert not res.ok and res.problems[0].startswith("line 1: syntax error")


def test_static_check_size_limit() -> None:
    assert not static.check_source(BASE + "#" * static.MAX_BYTES).ok


def test_parse_ptxas() -> None:
    text = (
        "ptxas info    : Compiling entry function 'kernel_cutlass_foo_0' for 'sm_90a'\n"
        "ptxas         .     8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
        "ptxas info    : Used 90 registers, used 1 barriers\n"
    )
    (k,) = parse_ptxas(text)
    assert (k.name, k.registers, k.spill_store_bytes, k.stack_bytes, k.barriers) == ("foo_0", 90, 4, 8, 1)
    (k,) = parse_ptxas(text.replace("1 barriers", "1 barriers, 1024 bytes smem"))
    assert k.static_smem_bytes == 1024 and k.smem_bytes is None  # no launch seen yet


def test_parse_ptxas_reads_the_spill_remark() -> None:
    """When ptxas spills, the DSL reprints its report as an indented remark that names no
    kernel: the spill must still be reported, and a single launch still matched to it."""
    text = (
        "remark[ptxas]: ptxas detected register spills\n"
        "          ptxas info    : Compiling entry function\n"
        "          ptxas info    : Function properties for\n"
        "          ptxas         .     184 bytes stack frame, 188 bytes spill stores, 188 bytes spill loads\n"
        "          ptxas info    : Used 64 registers, used 1 barriers, 184 bytes cumulative stack size\n"
    )
    (k,) = with_launches(parse_ptxas(text), {"foo_0": (512, 4096)})
    assert (k.registers, k.spill_store_bytes, k.stack_bytes, k.threads, k.dynamic_smem_bytes) == (
        64,
        188,
        184,
        512,
        4096,
    )


LAUNCH_IR = """
  llvm.func @cutlass___call___foo(%arg0: !llvm.ptr, %arg5: !llvm.ptr) -> i32 {
    %8 = llvm.mlir.constant(1 : i32) : i32
    %9 = llvm.mlir.constant(256 : i32) : i32
    %10 = llvm.mlir.constant(67088 : i64) : i64
    %12 = llvm.alloca %8 x !llvm.struct<(array<3 x i32>, array<3 x i32>, i64, ptr, ptr, i32)> : (i32) -> !llvm.ptr
    %15 = llvm.getelementptr %12[0, 1, 0] : (!llvm.ptr) -> !llvm.ptr, !llvm.struct<(array<3 x i32>, array<3 x i32>, i64, ptr, ptr, i32)>
    llvm.store %9, %15 : i32, !llvm.ptr
    %16 = llvm.getelementptr %12[0, 1, 1] : (!llvm.ptr) -> !llvm.ptr, !llvm.struct<(array<3 x i32>, array<3 x i32>, i64, ptr, ptr, i32)>
    llvm.store %8, %16 : i32, !llvm.ptr
    %17 = llvm.getelementptr %12[0, 1, 2] : (!llvm.ptr) -> !llvm.ptr, !llvm.struct<(array<3 x i32>, array<3 x i32>, i64, ptr, ptr, i32)>
    llvm.store %8, %17 : i32, !llvm.ptr
    %18 = llvm.getelementptr %12[0, 2] : (!llvm.ptr) -> !llvm.ptr, !llvm.struct<(array<3 x i32>, array<3 x i32>, i64, ptr, ptr, i32)>
    llvm.store %SMEM, %18 : i64, !llvm.ptr
    %112 = llvm.mlir.addressof @kernels_kernel_cutlass_foo_0 : !llvm.ptr
  }
"""


def test_parse_launches_reads_threads_and_shared_memory() -> None:
    assert parse_launches(LAUNCH_IR.replace("%SMEM", "%10")) == {"foo_0": (256, 67088)}
    # a size computed at run time is not a constant of the module: left out, not guessed
    assert parse_launches(LAUNCH_IR.replace("%SMEM", "%arg0")) == {}


def test_residency_follows_hopper_allocation_rules() -> None:
    # 121 registers round up to 128 (4096 a warp): 16 warps of 8, i.e. 2 CTAs; smem allows 3
    k = KernelResources("k", 121, 0, 0, 0, 1, 0, 67088, 256)
    assert k.residency(228) == (2, "registers")
    assert "67088 B shared memory, 256 threads: 2 CTAs per SM (limit: registers)" in k.describe(228)
    # 132624 + 1024 reserved B a CTA: one fits in 228 KB
    assert KernelResources("k", 111, 0, 0, 0, 1, 16, 132608, 256).residency(228) == (1, "shared memory")
    assert KernelResources("k", 16, 0, 0, 0, 1, 0, 0, 1024).residency(228) == (2, "threads")
    assert KernelResources("k", 32, 0, 0, 0, 1).residency(228) is None


@pytest.fixture(scope="module")
def judge():
    with Judge(gpu=False, compile_workers=2) as j:
        yield j


COMPILE_ONLY = JudgeOptions(stages=("static", "compile"), profile_shapes=[(64, 1024)], verify_ns=[1024, 5001])


def test_judge_compiles_reference_and_reports_resources(judge: Judge) -> None:
    v = judge.evaluate((REF / "softmax.py").read_text(), get_op("softmax"), "bfloat16", COMPILE_ONLY)
    assert v.status == "compiled", v.message
    assert v.compile and v.compile.n == [1024, 5001] and v.compile.kernels
    assert 0 < v.compile.kernels[0].registers <= 255
    assert Verdict.from_json(v.to_json()) == v


def test_compile_reports_shared_memory_and_residency(judge: Judge) -> None:
    opts = JudgeOptions(stages=("static", "compile"), profile_shapes=[(64, 4096)], verify_ns=[4096])
    v = judge.evaluate((REF / "softmax.py").read_text(), get_op("softmax"), "bfloat16", opts)
    (k,) = v.compile.kernels if v.compile else []
    # softmax stages its rows through shared memory: at least the CTA's row tile of bf16
    t = resolve_tiling(RowKnobs(stage_smem=True), 16, 4096)
    assert t.stage_smem and k.threads == t.num_threads and k.smem_bytes is not None
    assert t.rows_per_cta * t.cols_per_cta * 2 <= k.smem_bytes < t.rows_per_cta * t.cols_per_cta * 2 + 4096
    assert "B shared memory" in v.message and "CTAs per SM" in v.message


def test_bad_kernels_caught_without_gpu(judge: Judge) -> None:
    cpu_bad = [b for b in BAD if not b.gpu]
    verdicts = judge.evaluate_many([b.source() for b in cpu_bad], get_op("softmax"), "bfloat16", COMPILE_ONLY)
    for b, v in zip(cpu_bad, verdicts):
        assert v.status == b.status, (b.name, v.status, v.message)
        assert not v.passed


@pytest.mark.parametrize("bad", [b for b in BAD + HONEST if b.gpu], ids=lambda b: b.name)
def test_every_gpu_bad_kernel_and_its_twin_compile_for_sm90a(judge: Judge, bad) -> None:
    """What the GPU suite judges is a kernel that compiles: its verdict there is about its defect."""
    v = judge.evaluate(bad.source(), get_op(bad.op), "bfloat16", COMPILE_ONLY)
    assert v.status == "compiled", (bad.name, v.message)


def test_compile_error_is_trimmed_to_the_candidate_line(judge: Judge) -> None:
    (bad,) = [b for b in BAD if b.status == COMPILE_ERROR]
    v = judge.evaluate(bad.source(), get_op("softmax"), "bfloat16", COMPILE_ONLY)
    assert v.status == COMPILE_ERROR
    assert "name 'scale' is not defined" in v.message
    assert "candidate.py:39" in v.message and "llmcompile-worker" not in v.message
    assert "\x1b[" not in v.message and len(v.message.splitlines()) <= 40


def test_static_rejection_never_reaches_a_worker(judge: Judge) -> None:
    v = judge.evaluate("import torch\n", get_op("softmax"), "bfloat16", COMPILE_ONLY)
    assert v.status == STATIC_REJECTED and v.compile is None


def test_custom_op_from_kernelbench_file_compiles(judge: Judge) -> None:
    # a plain elementwise kernel over the problem's (M, 8192) tensors
    src = importlib.resources.files("tests").joinpath("swiglu_kernel.py").read_text()
    spec = get_op(str(Path(__file__).resolve().parents[1] / "evals" / "problems" / "swiglu.py"))
    v = judge.evaluate(src, spec, None, JudgeOptions(stages=("static", "compile")))
    assert v.status == "compiled", v.message


# --------------------------------------------------------------------------- isolation


def _compile_job(source: str, n: int = 1024) -> dict:
    """A compile job straight to a candidate process: the static check is bypassed on purpose."""
    sig = contract.Signature.of(get_op("softmax")).to_json()
    return {"kind": "compile", "source": source, "dtype": "bfloat16", "ns": [n], "signature": sig}


def test_a_crash_and_a_hang_never_cost_the_next_candidate_its_deadline() -> None:
    """Start-up (imports, CuTe DSL) happens before a process says `ready`, and the deadline
    starts only then: after a hang, an honest candidate is never judged `timeout`."""
    pool = CandidatePool(sandbox(), warm=1, timeouts={"compile": 20.0})
    try:
        crash = pool.run(_compile_job("import os\nos._exit(3)\n"))
        assert crash.failure == "crashed" and "exit code 3" in crash.detail
        hang = pool.run(_compile_job("while True:\n    pass\n"))
        assert hang.failure == "timeout" and hang.stage == "compile"
        ok = pool.run(_compile_job(BASE))
        assert ok.failure is None and ok.results["compile"]["ok"], ok.detail
        segv = pool.run(_compile_job("import ctypes\nctypes.string_at(0)\n"))
        assert segv.failure == "crashed" and "SIGSEGV" in segv.detail
    finally:
        pool.close()


def test_each_candidate_gets_a_fresh_process_and_no_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("SOMETHING_UNLISTED", "x")
    probe = "import os\nraise RuntimeError(f'pid={os.getpid()} ppid={os.getppid()} env={sorted(os.environ)}')\n"
    pool = CandidatePool(sandbox(), warm=1)
    try:
        a = pool.run(_compile_job(probe)).results["compile"]["error"]
        b = pool.run(_compile_job(probe)).results["compile"]["error"]
    finally:
        pool.close()
    assert "OPENAI_API_KEY" not in a and "SOMETHING_UNLISTED" not in a and "sk-secret" not in a
    assert "CUTE_DSL_ARCH" in a  # the allowlist passes what compiling needs
    # two candidates never share a process (in the sandbox both may be pid 2 of their own namespace)
    assert a != b or "pid=2 ppid=" in a


def test_candidate_prints_do_not_break_the_protocol() -> None:
    pool = CandidatePool(sandbox(), warm=0)
    try:
        out = pool.run(_compile_job('print("{\\"event\\": \\"done\\"}")\n' + BASE))
        assert out.failure is None and out.results["compile"]["ok"], out.detail
    finally:
        pool.close()


def test_judge_worker_holds_no_candidate_python(judge: Judge) -> None:
    """The judge's own processes (sealing here, verify/profile on the GPU) only ever see the
    candidate's compiled module as text and its sealed objects: no candidate module is imported
    there. Proof: after judging, ask the worker which modules it has."""
    v = judge.evaluate(BASE, get_op("softmax"), "bfloat16", COMPILE_ONLY)
    assert v.status == "compiled" and v.artifact, v.message
    facts = judge.sealer.run({"kind": "ping"}).results["ping"]
    assert facts["candidate_modules"] == [] and facts["modules"] > 100
    assert "OPENAI_API_KEY" not in facts["env"]


def test_bit_checks_take_a_0_dim_output() -> None:
    """A loss is a 0-dim tensor: the judge's own byte comparison must not fail on it (it did,
    and the judge's error was recorded as the candidate's crash)."""
    import torch

    from llmcompile.harness.guards import same_bits

    a = torch.tensor(1.5)
    assert same_bits(a, a.clone()) and not same_bits(a, torch.tensor(2.5))


def test_a_judge_bug_on_the_gpu_is_not_the_candidates_crash() -> None:
    from llmcompile.harness.guards import CandidateFault, device_fault

    assert device_fault(CandidateFault("AcceleratorError: illegal memory access"))
    assert device_fault(RuntimeError("CUDA error: an illegal memory access was encountered"))
    # a kernel allocates nothing: running out of memory means the judge's plan fell short
    assert not device_fault(RuntimeError("OutOfMemoryError: CUDA out of memory. Tried to allocate 14.00 GiB"))
    # what the judge's own check raised on a loss's 0-dim output (reported as the judge's now)
    assert not device_fault(RuntimeError("self.dim() cannot be 0 to view Float as Byte"))


def test_a_judge_sizes_itself_to_the_cores_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """An eval with one agent a GPU gives each its share of the host (LLMCOMPILE_CPUS): two agents
    of 32 cores each starting 28 compile processes was slower than either alone."""
    from llmcompile.harness.cpus import host_cpus

    monkeypatch.setenv("LLMCOMPILE_CPUS", "16")
    assert host_cpus() == 16
    monkeypatch.setenv("LLMCOMPILE_CPUS", "not a number")
    assert host_cpus() >= 1
    monkeypatch.delenv("LLMCOMPILE_CPUS")
    import os

    assert host_cpus() == len(os.sched_getaffinity(0))


FAKE_WORKER = """
import json, sys
print(json.dumps({"event": "ready", "pid": 0}), flush=True)
for line in sys.stdin:
    print(json.dumps({"event": "stage", "stage": "profile"}), flush=True)
    print(json.dumps({"event": "done", "stage": "harness", "detail": "the GPU is not the judge's alone"}), flush=True)
"""


def test_a_job_the_judge_could_not_judge_says_so_and_keeps_its_process(tmp_path: Path) -> None:
    """The judge's own trouble on a sound process: named (a JudgeFailure), not a crash, process kept."""
    (tmp_path / "fake_worker.py").write_text(FAKE_WORKER)
    ch = Channel("fake_worker", Sandbox(Layers(), unsafe=True), env={"PYTHONPATH": f"{tmp_path}:{ROOT}"})
    try:
        ch.wait_ready()
        out = ch.run({"kind": "gpu"})
        assert (out.failure, out.stage, out.detail) == (None, "harness", "the GPU is not the judge's alone")
        assert ch.proc is not None and ch.proc.poll() is None
    finally:
        ch.close()


class _Rerun:
    """A GPU worker that answers the judge's second run with `outcome` and keeps the job."""

    def __init__(self, outcome: JobOutcome) -> None:
        self.outcome, self.jobs = outcome, []

    def run(self, job: dict) -> JobOutcome:
        self.jobs.append(job)
        return self.outcome


_FAULT = "CandidateFault: AcceleratorError: CUDA error: an illegal memory access was encountered"
_VERIFIED = {"ok": True, "runs": 40, "failure": None}


def _profile(failure: dict | None = None) -> dict:
    return {"ok": failure is None, "sol_tbs": 3.0, "shapes": [], "flags": [], "failure": failure}


def _attribute(crashed: JobOutcome, again: JobOutcome, reruns: int = 1) -> tuple[JobOutcome, dict | None]:
    worker = _Rerun(again)
    job = {"stages": ["verify", "profile"], "read_only": True, "profile_shapes": [[4096, 1024], [262144, 1024]],
           "baselines": ["torch"], "baseline_cache": {"4096x1024": {}}}  # fmt: skip
    out = Judge._attribute_fault(SimpleNamespace(gpu_worker=worker), job, crashed)
    assert len(worker.jobs) == reruns
    return out, (worker.jobs or [None])[0]


def test_a_fault_while_timed_with_read_only_inputs_is_told_from_the_kernels_own_by_timing_again() -> None:
    at = {"m": 262144, "n": 1024, "case": "timed"}
    crashed = JobOutcome({"verify": _VERIFIED}, "crashed", "profile", _FAULT, at=at)
    out, job = _attribute(crashed, JobOutcome({"profile": _profile()}))
    # again at the shape it faulted on, the inputs writable, no baselines
    assert (job["stages"], job["read_only"], job["profile_shapes"]) == (["profile"], False, [[262144, 1024]])
    assert (job["baselines"], job["baseline_cache"]) == ([], {})
    assert out.failure is None and out.results["verify"] == _VERIFIED
    f = out.results["profile"]["failure"]
    assert not out.results["profile"]["ok"] and (f["check"], f["m"], f["n"]) == ("input_write", 262144, 1024)
    assert f["detail"].startswith("wrote into an input while it was timed") and "illegal memory access" in f["detail"]
    v = _finish(Verdict("", "", "softmax", "bfloat16", "h100", "0" * 64), out, JudgeOptions(), True)
    assert v.status == WRONG and v.message.startswith("the timed calls wrote into an input: [input_write]")

    wrong = CheckFailure("timed_output", 262144, 1024, "random", 0, "output set 1: 12 rows differ")
    out, _ = _attribute(crashed, JobOutcome({"profile": _profile(asdict(wrong))}))
    f = out.results["profile"]["failure"]
    assert f["check"] == "input_write" and "with them writable it fails this check (timed_output)" in f["detail"]


def test_a_fault_that_stays_when_the_inputs_are_writable_is_the_kernels_crash() -> None:
    crashed = JobOutcome(
        {"verify": _VERIFIED}, "crashed", "profile", _FAULT, at={"m": 4096, "n": 1024, "case": "timed"}
    )
    out, _ = _attribute(crashed, JobOutcome({}, "crashed", "profile", _FAULT))
    assert out is crashed
    v = _finish(Verdict("", "", "softmax", "bfloat16", "h100", "0" * 64), out, JudgeOptions(), True)
    assert v.status == CRASHED and v.message.startswith("crashed during profile")
    # not in the candidate's read-only run (making the sets, a baseline's timing, the checks): its crash, no rerun
    for at in ({}, {"m": 4096, "n": 1024, "case": "sets"}, {"m": 4096, "n": 1024, "case": "after timed"}):
        crashed = JobOutcome({"verify": _VERIFIED}, "crashed", "profile", _FAULT, at=at)
        assert _attribute(crashed, JobOutcome({"profile": _profile()}), reruns=0)[0] is crashed


def test_a_fault_during_verification_is_verified_again_with_writable_inputs() -> None:
    at = {"m": 4096, "n": 1024, "case": "random"}
    out, job = _attribute(JobOutcome({}, "crashed", "verify", _FAULT, at=at), JobOutcome({"verify": _VERIFIED}))
    assert (job["stages"], job["read_only"], job["baselines"]) == (["verify"], False, ["torch"])
    f = out.results["verify"]["failure"]
    assert f["check"] == "input_write" and f["detail"].startswith("wrote into an input: the kernel faulted")


def test_the_judge_says_when_its_gpu_worker_was_started_ready_and_warm(tmp_path: Path) -> None:
    """A fresh judge's first candidate waits for its GPU worker: the run's timeline says how long."""
    (tmp_path / "ready_worker.py").write_text(
        "import json, time\nprint(json.dumps({'event': 'ready', 'pid': 0, 'at': time.time()}), flush=True)\n"
    )
    ch = Channel("ready_worker", Sandbox(Layers(), unsafe=True), env={"PYTHONPATH": f"{tmp_path}:{ROOT}"})
    try:
        judge = SimpleNamespace(gpu_worker=ch, _warmed_at=0.0)
        ch.start()
        assert set(Judge.start_facts(judge)) == {"gpu_spawned"}  # (not ready yet, as far as it knows)
        ch.wait_ready()
        judge._warmed_at = time.time()
        f = Judge.start_facts(judge)
        assert f["gpu_spawned"] <= f["gpu_ready"] <= f["gpu_warmed"]
    finally:
        ch.close()
    assert Judge.start_facts(SimpleNamespace(gpu_worker=None, _warmed_at=0.0)) == {}
