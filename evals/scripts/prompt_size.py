"""What the LLM is shown: the system and task prompts' sizes for a few ops, in characters (about
four to a token).

    python -m evals.scripts.prompt_size [OP ...]      (default: the row ops and two level-1 files)
"""

from __future__ import annotations

import sys
from pathlib import Path

from llmcompile.agent.prompting import PromptContext, system_prompt, task_prompt
from llmcompile.specs import get_op
from llmcompile.specs.targets import DEFAULT_TARGET, get_target

LEVEL1 = Path(__file__).resolve().parents[3] / "shared" / "kernelbench" / "level1"
DEFAULT = ["softmax", "rmsnorm", "rmsnorm_bwd", "cross_entropy"] + [
    str(p) for p in (LEVEL1 / "23_Softmax.py", LEVEL1 / "47_Sum_reduction_over_a_dimension.py") if p.is_file()
]


def main(argv: list[str]) -> int:
    target = get_target(DEFAULT_TARGET)
    for op in argv or DEFAULT:
        spec = get_op(op)
        ctx = PromptContext(spec, spec.dtypes[0], target, 90.0, 3.0)
        system, task = system_prompt(ctx), task_prompt(ctx)
        print(f"{spec.name:36s} system {len(system):7,d} chars   task {len(task):7,d} chars")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
