"""Run one candidate's verify stage in this process with timings (debugging the judge)."""

import sys
import time
from pathlib import Path

import torch

from llmcompile.harness import compiler, gpu_stages
from llmcompile.ops import get_op, verify_shapes

src = Path(sys.argv[1]).read_text() if len(sys.argv) > 1 else None
spec = get_op("softmax")
shapes = verify_shapes(spec, [1024, 5001])
t = time.time()
res, fns = compiler.compile_candidate(src, spec, "bfloat16", sorted({n for _, n in shapes}), Path("/tmp"))
print("compile", res.ok, time.time() - t, flush=True)
for m, n in shapes:
    t = time.time()
    v = gpu_stages.verify_candidate(fns, spec, "bfloat16", [(m, n)])
    torch.cuda.synchronize()
    print(m, n, v.ok, v.runs, v.failure, round(time.time() - t, 2), flush=True)
