"""CPU (CI): candidates that try to escape are stopped by the sandbox, with a verdict naming what
was refused. Each escape runs at import time and bypasses the static check (straight to a candidate
process), so only the sandbox stands in the way; where it is safe to, a control runs the same
candidate with the namespaces off and shows the escape working there: these tests can fail."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from llmcompile.harness.sandbox import CANDIDATE_LIMITS, ROOT, Layers, Sandbox, bwrap_argv, detect, sandbox
from llmcompile.harness.worker import CandidatePool, JobOutcome
from llmcompile.specs import contract, get_op
from tests.bad_kernels import BASE

LAYERS = detect()
needs_ns = pytest.mark.skipif(not LAYERS.namespaces, reason="no namespaces here: " + "; ".join(LAYERS.problems))
# root is exempt from the process rlimit: then only a pids cgroup can hold a fork bomb
PROCESS_LIMIT = os.geteuid() != 0 or LAYERS.uid or LAYERS.pids_cgroup is not None
needs_process_limit = pytest.mark.skipif(
    not PROCESS_LIMIT, reason="root here, with neither uid nobody nor a pids cgroup"
)


def run_candidate(payload: str, sb: Sandbox | None = None) -> JobOutcome:
    """The payload at the top of an otherwise honest kernel module, compiled for N=1024."""
    sig = contract.Signature.of(get_op("softmax")).to_json()
    job = {"kind": "compile", "source": payload + BASE, "dtype": "bfloat16", "ns": [1024], "signature": sig}
    pool = CandidatePool(sb or sandbox(), warm=0)
    try:
        return pool.run(job)
    finally:
        pool.close()


def unsandboxed() -> Sandbox:
    return Sandbox(Layers(), unsafe=True)


def said(out: JobOutcome) -> str:
    """What the verdict would say: the compile error, or how the process ended."""
    return out.results.get("compile", {}).get("error", "") + out.detail


def test_no_layers_refuses_without_the_unsafe_flag() -> None:
    from llmcompile.harness.sandbox import SandboxUnavailable

    with pytest.raises(SandboxUnavailable, match="--unsafe-no-sandbox"):
        run_candidate("", Sandbox(Layers(problems=["no bwrap"]), unsafe=False))


@needs_ns
def test_shell_command_cannot_write_outside_its_scratch(tmp_path: Path) -> None:
    marker = ROOT / f"pwned-{uuid.uuid4().hex[:8]}"
    outside = tmp_path / "pwned"
    payload = (
        "import subprocess\n"
        f"subprocess.run('echo x > {outside}', shell=True)\n"
        f"subprocess.run('echo x > {marker}', shell=True, check=True, capture_output=True)\n"
    )
    out = run_candidate(payload)
    assert not marker.exists() and not outside.exists()
    assert not out.results["compile"]["ok"] and "CalledProcessError" in said(out)
    # the control: the same candidate without namespaces writes both files
    try:
        run_candidate(payload, unsandboxed())
        assert marker.exists() and outside.exists()
    finally:
        marker.unlink(missing_ok=True)


@needs_ns
def test_python_cannot_write_the_project_or_the_judge() -> None:
    target = ROOT / "llmcompile" / "harness" / "static.py"
    before = target.read_bytes()
    out = run_candidate(f"open({str(target)!r}, 'a').write('# patched')\n")
    assert target.read_bytes() == before
    # read-only mount, or (as uid nobody) not the owner: refused either way, and said so
    assert "Read-only file system" in said(out) or "Permission denied" in said(out)


@needs_ns
def test_api_key_of_another_process_is_out_of_reach() -> None:
    """The agent holds the user's key in its environment; a candidate scans every process it can
    see and would put what it finds in its error message (what the agent feeds back)."""
    secret = "sk-sandbox-test-" + uuid.uuid4().hex
    holder = subprocess.Popen(["sleep", "60"], env={"OPENAI_API_KEY": secret})
    payload = (
        "import os, glob\n"
        "found = []\n"
        "for p in glob.glob('/proc/[0-9]*/environ'):\n"
        "    try:\n"
        "        found += [v for v in open(p, 'rb').read().split(b'\\0') if b'sk-sandbox-test' in v]\n"
        "    except OSError:\n"
        "        pass\n"
        "raise RuntimeError(f'found {found} in {len(glob.glob(\"/proc/[0-9]*\"))} processes')\n"
    )
    try:
        out = run_candidate(payload)
        assert secret not in said(out) and "found []" in said(out)
        control = run_candidate(payload, unsandboxed())
        assert secret in said(control)
    finally:
        holder.kill()
        holder.wait()


@needs_ns
def test_home_directory_is_hidden() -> None:
    d = Path.home() / ".cache" / f"llmcompile-sandbox-test-{uuid.uuid4().hex[:8]}"
    d.mkdir(parents=True)
    (d / "key").write_text("sk-home-secret")
    payload = f"raise RuntimeError('read ' + open({str(d / 'key')!r}).read())\n"
    try:
        out = run_candidate(payload)
        assert "sk-home-secret" not in said(out) and "No such file" in said(out)
        assert "sk-home-secret" in said(run_candidate(payload, unsandboxed()))
    finally:
        (d / "key").unlink()
        d.rmdir()


@needs_ns
def test_no_network_not_even_loopback() -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(15)
    port = srv.getsockname()[1]
    got: list[bytes] = []

    def accept() -> None:
        try:
            while True:
                conn, _ = srv.accept()
                got.append(conn.recv(64))
                conn.close()
        except OSError:
            pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    payload = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=5).sendall(b'pwned')\n"
    try:
        out = run_candidate(payload)
        assert "Network is unreachable" in said(out) or "Connection refused" in said(out)
        assert got == []
        run_candidate(payload, unsandboxed())
        # (the server thread reads the unsandboxed control's bytes when it is scheduled: on two
        # busy CI cores that once took over the 1 s a join gave it, and the check failed)
        deadline = time.monotonic() + 15
        while not got and time.monotonic() < deadline:
            time.sleep(0.05)
        assert got == [b"pwned"]
    finally:
        srv.close()


@needs_ns
def test_patching_the_judge_does_not_outlive_the_candidate() -> None:
    """A candidate rewrites the compiler in its own process; the next candidate, in a fresh
    process, is judged by the real one (a broken kernel is still a compile error)."""
    patch = (
        "import llmcompile.harness.compiler as c\n"
        "from llmcompile.harness.verdict import CompileResult\n"
        "c.compile_candidate = lambda *a, **k: (CompileResult(True, [1024]), {})\n"
    )
    sb = sandbox()
    pool = CandidatePool(sb, warm=1)
    sig = contract.Signature.of(get_op("softmax")).to_json()
    try:
        pool.run({"kind": "compile", "source": patch + BASE, "dtype": "bfloat16", "ns": [1024], "signature": sig})
        broken = BASE.replace("inv = 1.0 / s", "inv = 1.0 / undefined_name")
        out = pool.run({"kind": "compile", "source": broken, "dtype": "bfloat16", "ns": [1024], "signature": sig})
    finally:
        pool.close()
    assert not out.results["compile"]["ok"] and "undefined_name" in said(out)


@needs_ns
@needs_process_limit
def test_fork_bomb_is_stopped_and_cleaned_up() -> None:
    tag = uuid.uuid4().hex[:8]
    payload = (
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    for _ in range(5000):\n"
        "        if os.fork() == 0:\n"
        f"            time.sleep(60)  # {tag}\n"
        "            os._exit(0)\n"
        "        n += 1\n"
        "except OSError as e:\n"
        "    raise RuntimeError(f'stopped after {n} processes: {e}')\n"
    )
    out = run_candidate(payload)
    text = said(out)
    assert "stopped after" in text and "Resource temporarily unavailable" in text, text
    assert int(text.split("stopped after ")[1].split()[0]) < 600
    leftovers = subprocess.run(["pgrep", "-f", tag], capture_output=True, text=True).stdout.split()
    assert leftovers == []


@needs_ns
def test_filling_the_disk_stops_at_the_scratch_limit() -> None:
    payload = (
        "chunk = b'x' * (64 << 20)\n"
        "for i in range(64):\n"
        "    with open(f'fill{i}', 'wb') as f:\n"
        "        for _ in range(4):\n"
        "            f.write(chunk)\n"
    )
    out = run_candidate(payload)
    assert "No space left on device" in said(out) or "SIGXFSZ" in said(out), said(out)


def test_memory_is_limited() -> None:
    out = run_candidate("x = bytearray(40 << 30)\n", sandbox(unsafe=True))
    assert "MemoryError" in said(out)


@needs_ns
def test_honest_candidate_compiles_in_the_sandbox() -> None:
    out = run_candidate("")
    assert out.failure is None and out.results["compile"]["ok"], said(out)
    assert set(out.payload["modules"]) == {"1024"}


def test_bwrap_hides_homes_and_binds_python_back() -> None:
    argv = bwrap_argv("bwrap", "/tmp/sandbox", False, CANDIDATE_LIMITS)
    pairs = list(zip(argv, argv[1:]))
    assert ("--tmpfs", "/root") in pairs and ("--tmpfs", "/tmp") in pairs and "--unshare-all" in argv
    exe_dir = Path(sys.executable).resolve().parent
    if any(d == exe_dir or d in exe_dir.parents for d in map(Path, ("/root", "/home", "/tmp", str(Path.home())))):
        assert ("--ro-bind", str(exe_dir)) in pairs or any(
            a == "--ro-bind" and Path(b) in exe_dir.parents for a, b in pairs
        )
