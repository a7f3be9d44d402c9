"""The candidate process: the one place a candidate's Python runs (inside the sandbox).

It starts, applies its limits, imports CuTe DSL, says `ready`, then takes exactly one job:
import the candidate, compile it for each N, and send back the compile result and each N's
host module as text. Then it exits, so nothing a candidate did to this process outlives it.
It imports neither torch nor the problem's Python: the op's signature arrives as data.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path


def main() -> None:
    from llmcompile.harness.sandbox import apply_limits

    apply_limits()
    from llmcompile.harness.worker import protocol

    send = protocol()
    import cutlass.cute  # noqa: F401 - start-up work, before `ready`

    from llmcompile.harness import compiler
    from llmcompile.specs import contract

    compiler.warm_up()  # (a fresh process's first compile costs seconds: not a candidate's)
    send(event="ready", pid=os.getpid())
    line = sys.stdin.readline()
    if not line.strip():
        return
    job = json.loads(line)
    work = Path.cwd() / "job"
    work.mkdir(exist_ok=True)
    os.chdir(work)
    send(event="stage", stage="compile")
    sig = contract.Signature.from_json(job["signature"])
    result, modules = compiler.compile_candidate(job["source"], sig, job["dtype"], job["ns"], work)
    if result.ok:
        send(event="payload", data={"modules": {str(n): text for n, text in modules.items()}})
    send(event="result", stage="compile", data=asdict(result))
    send(event="done")


if __name__ == "__main__":
    main()
