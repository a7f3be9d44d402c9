"""A run's GPU worker, started before the agent process imports torch, for its judge to take.

The GPU worker is the last judge process a run waits for: its imports, a CUDA context and the
device's bandwidth take about 6 s after it is spawned, and the judge spawned it only after the
agent's own imports (2 s), so a cached kernel's first verdict waited for it (8 s after the
process started on an H200: evals/results/judge-speed). `llmcompile.entry` starts it first thing
for a run that will use the GPU; `Judge` takes it, or closes it when it cannot use it. Light:
nothing here imports torch.
"""

from __future__ import annotations

import atexit
import os

from llmcompile.harness.sandbox import Sandbox, sandbox
from llmcompile.harness.worker import Channel, judge_worker

_started: dict[bool, tuple[Sandbox, Channel]] = {}  # unsafe_no_sandbox -> its sandbox and process


def gpu_visible() -> bool:
    """Whether this process may see an NVIDIA GPU, asked without torch (the driver's device node,
    not hidden by CUDA_VISIBLE_DEVICES); the judge asks torch before it takes the process."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1"):
        return False
    return os.path.exists("/dev/nvidiactl")


def start(unsafe: bool = False) -> bool:
    """Start the GPU worker now, where a GPU is visible; whether one is started."""
    if _started or not gpu_visible():
        return bool(_started)
    try:
        box = sandbox(unsafe, gpu=True)
        ch = judge_worker(box, gpu=True)
        ch.start()
    except Exception:  # noqa: BLE001 - the judge starts its own later, and says what is wrong
        return False
    _started[unsafe] = (box, ch)
    atexit.register(close)
    return True


def take(unsafe: bool) -> tuple[Sandbox, Channel] | None:
    """The worker started for this sandbox setting (its sandbox with it), once; any other closed."""
    got = _started.pop(unsafe, None)
    close()
    return got


def close() -> None:
    while _started:
        _, (_, ch) = _started.popitem()
        ch.dispose()
