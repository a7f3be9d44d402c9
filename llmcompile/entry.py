"""The `llmcompile` command's entry, and `python -m llmcompile`'s: a run that will use the GPU
starts its GPU worker here (`harness/early.py`), before the CLI's imports (torch alone is 1.5-2 s
on the lent hosts), then the CLI runs. Nothing here imports torch."""

from __future__ import annotations

import sys

from llmcompile import COMMANDS


def gpu_run(argv: list[str]) -> bool:
    """Whether these arguments are an agent run that will verify and time on a GPU (`run OP`, or
    the main job's `OP` alone; not compile-only, not a request for help)."""
    if not argv or argv[0].startswith("-") or (argv[0] in COMMANDS and argv[0] != "run"):
        return False
    return not {"--compile-only", "-h", "--help"} & set(argv)


def main() -> int:
    argv = sys.argv[1:]
    if gpu_run(argv):
        from llmcompile.harness import early

        early.start(unsafe="--unsafe-no-sandbox" in argv)
    from llmcompile.cli import main as cli_main

    return cli_main()
