"""CPU (CI): the judge's static check, compile diagnostics and worker isolation."""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path

import pytest

from llmcompile.harness import COMPILE_ERROR, STATIC_REJECTED, Judge, JudgeOptions, static
from llmcompile.harness.compiler import parse_ptxas
from llmcompile.harness.verdict import Verdict
from llmcompile.harness.worker import Job, Worker, worker_env
from llmcompile.ops import BUILTIN, get_op
from tests.bad_kernels import BAD, BASE

REF = Path(__file__).resolve().parents[1] / "reference_kernels"


@pytest.mark.parametrize("op", sorted(BUILTIN))
def test_reference_kernels_pass_static_check(op: str) -> None:
    res = static.check_source((REF / f"{BUILTIN[op].reference_module}.py").read_text())
    assert res.ok, res.problems


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


def test_bad_kernels_caught_without_gpu(judge: Judge) -> None:
    cpu_bad = [b for b in BAD if not b.gpu]
    verdicts = judge.evaluate_many([b.source() for b in cpu_bad], get_op("softmax"), "bfloat16", COMPILE_ONLY)
    for b, v in zip(cpu_bad, verdicts):
        assert v.status == b.status, (b.name, v.status, v.message)
        assert not v.passed


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


def _job(source: str) -> Job:
    return Job(source, "softmax", "bfloat16", ["compile"], [1024])


def test_worker_survives_a_crash_and_a_hang() -> None:
    w = Worker(cuda_visible="", timeouts={"compile": 5.0})
    try:
        crash = w.run(_job("import os\nos._exit(3)\n"))  # the static check is bypassed on purpose
        assert crash.failure == "crashed" and "exit code 3" in crash.detail
        hang = w.run(_job("while True:\n    pass\n"))
        assert hang.failure == "timeout" and hang.stage == "compile"
        ok = w.run(_job(BASE))  # a fresh worker takes the next candidate
        assert ok.failure is None and ok.results["compile"]["ok"]
        segv = w.run(_job("import ctypes\nctypes.string_at(0)\n"))
        assert segv.failure == "crashed"
    finally:
        w.close()


def test_worker_stays_warm_and_sees_no_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("MY_TOKEN", "t")
    assert "OPENAI_API_KEY" not in worker_env() and "MY_TOKEN" not in worker_env()
    w = Worker(cuda_visible="")
    try:
        a = w.run(Job("", "softmax", "bfloat16", [], [], kind="ping")).results["ping"]
        b = w.run(Job("", "softmax", "bfloat16", [], [], kind="ping")).results["ping"]
        assert a["pid"] == b["pid"] != os.getpid()
        assert "OPENAI_API_KEY" not in a["env"] and "MY_TOKEN" not in a["env"]
    finally:
        w.close()


def test_candidate_prints_do_not_break_the_protocol() -> None:
    w = Worker(cuda_visible="")
    try:
        out = w.run(_job('print("{\\"event\\": \\"done\\"}")\n' + BASE))
        assert out.failure is None and out.results["compile"]["ok"]
    finally:
        w.close()
