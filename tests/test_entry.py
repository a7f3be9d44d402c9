"""llmcompile.entry: a run that will use the GPU starts its GPU worker before anything imports torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from llmcompile.entry import gpu_run
from llmcompile.harness.sandbox import ROOT


@pytest.mark.parametrize(
    ("argv", "starts"),
    [
        (["softmax", "--target", "h100"], True),  # the main job
        (["run", "softmax"], True),
        (["run", "--resume", "runs/x"], True),  # (a compile-only run resumed: the judge closes it)
        (["evals/problems/23_Softmax.py", "--samples", "1"], True),
        (["softmax", "--compile-only"], False),
        (["softmax", "--help"], False),
        (["eval", "evals/suites/smoke.toml"], False),  # (each problem's own process starts its own)
        (["check", "k.py", "--op", "softmax"], True),  # (a kernel judged: its verdict's wait too)
        (["check", "k.py", "--op", "softmax", "--stages", "static,compile"], False),
        (["check", "k.py", "--op", "softmax", "--stages=static,compile,verify"], True),
        (["bench", "softmax"], False),
        (["list"], False),
        (["--help"], False),
        ([], False),
    ],
)
def test_which_commands_start_a_gpu_worker_first(argv: list[str], starts: bool) -> None:
    assert gpu_run(argv) is starts


def test_the_gpu_worker_is_started_before_torch_is_imported() -> None:
    """The 1.5-2 s of the agent's imports are not in front of the worker's own start-up."""
    code = """
import atexit, sys
from llmcompile.harness import early
seen = []
early.start = lambda unsafe=False: seen.append(("torch" in sys.modules, unsafe))
atexit.register(lambda: print("SEEN", seen))
sys.argv = ["llmcompile", "no_such_op", "--unsafe-no-sandbox"]
from llmcompile.entry import main
sys.exit(main())
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "unknown op" in out.stderr  # (the CLI ran after it, and said why)
    assert "SEEN [(False, True)]" in out.stdout
