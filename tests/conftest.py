from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

# On a host of several GPUs, .ci/gpu sets GPU_SPREAD to their count: each pytest-xdist worker
# then sees one GPU of its own (set before torch first looks at the devices), so the memory a
# test plans for "its" GPU is not shared with the workers on the others.
_worker, _spread = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("GPU_SPREAD", "")
if _worker.startswith("gw") and _spread.isdigit() and int(_spread) > 1 and "CUDA_VISIBLE_DEVICES" not in os.environ:
    os.environ["CUDA_VISIBLE_DEVICES"] = str(int(_worker[2:]) % int(_spread))


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


HAS_GPU = _has_gpu()


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run .ci/gpu on the H100)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
