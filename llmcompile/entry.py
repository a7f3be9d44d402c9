"""The `llmcompile` command's entry, and `python -m llmcompile`'s: a run that will use the GPU
starts its GPU worker here (`harness/early.py`), before the CLI's imports (torch alone is 1.5-2 s
on the lent hosts), then the CLI runs. Nothing here imports torch."""

from __future__ import annotations

import sys

from llmcompile import COMMANDS


def gpu_run(argv: list[str]) -> bool:
    """Whether these arguments will verify or time kernels on a GPU through a judge: an agent run
    (`run OP`, or the main job's `OP` alone) not compile-only, or `check` with a GPU stage; never
    a request for help."""
    if not argv or argv[0].startswith("-") or {"-h", "--help"} & set(argv):
        return False
    if argv[0] == "check":
        stages = _option(argv, "--stages") or "verify,profile"
        return bool({"verify", "profile"} & set(stages.split(",")))
    return (argv[0] == "run" or argv[0] not in COMMANDS) and "--compile-only" not in argv


def _option(argv: list[str], name: str) -> str | None:
    """An option's value, given as `NAME VALUE` or `NAME=VALUE` (argparse takes both)."""
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def main() -> int:
    argv = sys.argv[1:]
    if gpu_run(argv):
        from llmcompile.harness import early

        early.start(unsafe="--unsafe-no-sandbox" in argv)
    from llmcompile.cli import main as cli_main

    return cli_main()
