"""CPU (CI): baselines' timings kept across runs by machine, software, problem and shape."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

from llmcompile.harness.baseline_cache import BaselineCache, NoBaselineCache, key
from llmcompile.harness.judge import Judge

H100 = {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0", "cuda": "13.0", "triton": "3.6.0", "quack": "0.6.5"}


def test_a_timing_is_found_by_its_key_and_only_while_young(tmp_path: Path) -> None:
    cache = BaselineCache(tmp_path / "b.json", max_age_s=60)
    k = key(H100, "softmax", "bfloat16", 4096, 4096, "compile")
    cache.store({k: {"ms": 0.5, "tbs": 2.1, "t": time.time()}})
    assert cache.lookup({"compile": k}) == {
        "compile": {"ms": 0.5, "tbs": 2.1, "t": cache.lookup({"compile": k})["compile"]["t"]}
    }
    old = key(H100, "softmax", "bfloat16", 8192, 4096, "compile")
    cache.store({old: {"ms": 1.0, "tbs": 2.0, "t": time.time() - 120}})
    assert cache.lookup({"compile": old}) == {}
    assert NoBaselineCache(tmp_path / "b.json").lookup({"compile": k}) == {}


def test_another_gpu_torch_shape_or_problem_is_another_key(tmp_path: Path) -> None:
    k = key(H100, "softmax", "bfloat16", 4096, 4096, "compile")
    assert k != key({**H100, "gpu": "NVIDIA H200"}, "softmax", "bfloat16", 4096, 4096, "compile")
    assert k != key({**H100, "torch": "2.12.0"}, "softmax", "bfloat16", 4096, 4096, "compile")
    assert k != key(H100, "softmax", "float32", 4096, 4096, "compile")
    assert k != key(H100, "softmax", "bfloat16", 4096, 4096, "eager")
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("x = 1\n")
    b.write_text("x = 2\n")
    assert key(H100, str(a), "float32", 1, 1, "eager") != key(H100, str(b), "float32", 1, 1, "eager")
    b.write_text("x = 1\n")  # the same problem in another file is the same problem
    assert key(H100, str(a), "float32", 1, 1, "eager") == key(H100, str(b), "float32", 1, 1, "eager")


def test_an_unreadable_cache_is_empty_and_an_unwritable_one_is_no_error(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    path.write_text("{not json")
    assert BaselineCache(path).lookup({"x": "y"}) == {}
    BaselineCache(tmp_path / "missing" / "dir" / "b.json").store({"k": {"ms": 1.0, "tbs": 1.0, "t": 0.0}})
    blocked = tmp_path / "file"
    blocked.write_text("")
    BaselineCache(blocked / "b.json").store({"k": {"ms": 1.0, "tbs": 1.0, "t": 0.0}})  # a file where a dir should be


def _stored(tmp_path: Path, profile: dict) -> dict:
    """What the judge keeps of `profile`'s baselines (Judge._store_baselines, without a GPU worker)."""
    cache = BaselineCache(tmp_path / f"{len(list(tmp_path.iterdir()))}.json")  # (a new cache each call)
    judge = SimpleNamespace(
        baselines=cache,
        _baseline_keys=lambda spec, dtype, m, n, names: {b: key(H100, "softmax", dtype, m, n, b) for b in names},
    )
    Judge._store_baselines(judge, None, "bfloat16", profile, ["eager", "compile"])
    return json.loads(cache.path.read_text()) if cache.path.exists() else {}


def test_only_baselines_timed_soundly_here_are_kept(tmp_path: Path) -> None:
    shape = {"m": 8, "n": 8, "baselines": {"eager": 2.1, "compile": 2.5}, "baseline_ms": {"eager": 0.1, "compile": 0.1}}
    assert len(_stored(tmp_path, {"shapes": [shape]})) == 2
    # one taken from the cache is not stored again; one whose own timing was flagged is not kept
    kept = _stored(tmp_path, {"shapes": [{**shape, "baseline_age_s": {"compile": 60.0}}]})
    assert [json.loads(k)[-1] for k in kept] == ["eager"]
    kept = _stored(
        tmp_path, {"shapes": [{**shape, "baseline_notes": {"eager": "TIMER MISMATCH: events 0.1 ms vs ..."}}]}
    )
    assert [json.loads(k)[-1] for k in kept] == ["compile"]
    # none where the GPU was not the judge's alone right after them
    assert (
        _stored(tmp_path, {"shapes": [shape], "disturbed": "the judge's own copy: events 0.13 ms vs wall 0.27"}) == {}
    )
