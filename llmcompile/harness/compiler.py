"""Stage 2: compile a candidate for sm_90a (no GPU needed) and report what ptxas saw.

Runs inside a worker process. Errors come back trimmed to what an LLM can act on: the
message and the candidate's own failing line, not the DSL's internals or pages of MLIR.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from llmcompile.harness.verdict import CompileResult, KernelResources
from llmcompile.runtime.launches import check_launchable, launches_of, short_name
from llmcompile.specs import contract

if TYPE_CHECKING:
    from llmcompile.specs import OpSpec

ANSI = re.compile(r"\x1b\[[0-9;]*m")
MAX_ERROR_LINES = 30
# When ptxas spills, the DSL reprints its report as an indented remark without the name.
UNNAMED = "kernel"
_PTXAS_ENTRY = re.compile(r"Compiling entry function(?: '([^']+)')?")
_PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_REGS = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:, (\d+) bytes smem)?")


@contextmanager
def captured_fds() -> Iterator[list[str]]:
    """Capture what C code writes to fds 1 and 2 (ptxas remarks), as well as Python's."""
    out: list[str] = []
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        saved = [os.dup(1), os.dup(2)]
        try:
            os.dup2(tmp.fileno(), 1)
            os.dup2(tmp.fileno(), 2)
            yield out
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            tmp.seek(0)
            out.append(tmp.read().decode(errors="replace"))


def parse_ptxas(text: str) -> list[KernelResources]:
    kernels: list[KernelResources] = []
    name = None
    frame: tuple[int, int, int] | None = None
    for line in ANSI.sub("", text).splitlines():
        if m := _PTXAS_ENTRY.search(line):
            name, frame = m.group(1) or UNNAMED, None
        elif (m := _PTXAS_FRAME.search(line)) and name:
            frame = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        elif (m := _PTXAS_REGS.search(line)) and name:
            stack, st, ld = frame or (0, 0, 0)
            short = short_name(name)
            kernels.append(
                KernelResources(short, int(m.group(1)), st, ld, stack, int(m.group(2) or 0), int(m.group(3) or 0))
            )
            name = None
    return kernels


def with_launches(kernels: list[KernelResources], launches: dict[str, tuple[int, int]]) -> list[KernelResources]:
    for k in kernels:
        if k.name in launches:
            k.threads, k.dynamic_smem_bytes = launches[k.name]
        elif k.name == UNNAMED and len(kernels) == 1 and len(launches) == 1:
            # (a spill report names no kernel; with one of each there is no doubt which)
            k.threads, k.dynamic_smem_bytes = next(iter(launches.values()))
    return kernels


def trim_error(exc: BaseException, source_path: Path, source: str) -> str:
    """The exception's message without colour codes or MLIR dumps, and the candidate's
    lines that the traceback or the message points at."""
    # the worker's scratch path means nothing to the author: call the file what it is
    text = ANSI.sub("", f"{type(exc).__name__}: {exc}").replace(str(source_path), source_path.name)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    keep = []
    for ln in lines:
        if re.match(r"\s*(%\w+ = |\^bb|\"?llvm\.|cute\.|!cute)", ln) and len(keep) > 3:
            continue  # IR operations
        keep.append(ln[:300])
    msg = "\n".join(keep[:MAX_ERROR_LINES])
    if len(keep) > MAX_ERROR_LINES:
        msg += f"\n... ({len(keep) - MAX_ERROR_LINES} more lines)"
    src_lines = source.splitlines()
    where = set()
    for fr in traceback.extract_tb(exc.__traceback__):
        if Path(fr.filename).name == source_path.name and fr.lineno:
            where.add(fr.lineno)
    for m in re.finditer(re.escape(source_path.name) + r"\"?:(\d+)", text):
        where.add(int(m.group(1)))
    if where and str(source_path.name) + ":" not in msg:
        for ln in sorted(where)[-3:]:
            if 0 < ln <= len(src_lines):
                msg += f"\n  at candidate line {ln}: {src_lines[ln - 1].strip()}"
    return msg


def compile_candidate(
    source: str,
    spec: OpSpec | contract.Signature,
    dtype: str,
    ns: list[int],
    workdir: Path,
    module_name: str | None = None,
) -> tuple[CompileResult, dict[int, str]]:
    """Compile for each N; return the result and each N's host module as MLIR text (what
    `runtime/seal.py` turns into the object file that is run). `module_name`: what the source is
    imported as (default: contract.load_module's name for a candidate)."""
    contract.ensure_arch()
    t0 = time.perf_counter()
    path = workdir / "candidate.py"
    path.write_text(source)
    modules: dict[int, str] = {}
    kernels: list[KernelResources] = []
    by_n: dict[int, list[KernelResources]] = {}
    workspace = 0
    try:
        mod = contract.load_module(path, module_name)
        entry = contract.entry_of(mod)
        workspace = contract.workspace_of(mod)
        for n in ns:
            with captured_fds() as out:
                fn = contract.compile_entry(entry, spec, dtype, n, options="remarks{ptx}", workspace=workspace)
            launches = launches_of(fn)
            check_launchable(launches)
            modules[n] = str(fn.ir_module)
            found = with_launches(parse_ptxas(out[0]), launches)
            kernels = by_n[n] = found or kernels
    except Exception as e:  # noqa: BLE001 - every failure of the candidate is a verdict
        failing_n = next((n for n in ns if n not in modules), None)
        err = trim_error(e, path, source)
        if failing_n is not None and len(ns) > 1:
            err = f"(compiling for N={failing_n}, dtype {dtype})\n{err}"
        result = CompileResult(False, list(modules), err, kernels, time.perf_counter() - t0, workspace, by_n)
        return result, modules
    return CompileResult(True, list(ns), "", kernels, time.perf_counter() - t0, workspace, by_n), modules


def warm_up() -> dict[int, str]:
    """Compile the copy reference kernel once, for one small N: a process's first compile pays
    for CuTe DSL's lazy set-up (2-3 s against 0.35 s for each one after, on a 2-core machine), and
    a judge process does that before it says it is ready, not in a candidate's time. Returns the
    host modules (a sealer seals them, for its own warm-up)."""
    import importlib.resources
    import tempfile

    source = importlib.resources.files("reference_kernels").joinpath("copy.py").read_text()
    rows = contract.TensorSig(("M", "N"))
    sig = contract.Signature((rows, rows), {})  # (as data: this process imports no torch)
    with tempfile.TemporaryDirectory() as work:
        result, modules = compile_candidate(source, sig, "bfloat16", [256], Path(work), "llmcompile_warm_up_copy")
    return modules if result.ok else {}
