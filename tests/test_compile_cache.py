"""CPU (CI): each N's sealed kernel kept by what it was compiled from, and a candidate's N
compiled across several processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmcompile.harness import Judge, JudgeOptions
from llmcompile.harness.compile_cache import CompileCache, key
from llmcompile.specs import get_op

REF = Path(__file__).resolve().parents[1] / "reference_kernels"
OPTS = JudgeOptions(stages=("static", "compile"), profile_shapes=[(64, 1024)], verify_ns=[1024, 5001, 4096])


@pytest.fixture(scope="module")
def judge(tmp_path_factory: pytest.TempPathFactory):
    with Judge(gpu=False, compile_workers=1, cache=CompileCache(tmp_path_factory.mktemp("cache"))) as j:
        j.parts = 2  # each candidate's N over two processes, even on a 2-core machine
        yield j


def _objects(art: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(Path(art).glob("*.o"))}


def test_a_source_judged_again_is_not_compiled_again(judge: Judge) -> None:
    src = (REF / "softmax.py").read_text()
    first = judge.evaluate(src, get_op("softmax"), "bfloat16", OPTS)
    assert first.status == "compiled" and first.compile and first.compile.cached == []
    assert first.compile.n == [1024, 4096, 5001] and first.timeline["compile"] > 0.1
    again = judge.evaluate(src, get_op("softmax"), "bfloat16", OPTS)
    assert again.status == "compiled" and again.compile and again.compile.cached == [1024, 4096, 5001]
    assert again.timeline["compile"] < 0.5 and again.compile.kernels == first.compile.kernels
    assert _objects(again.artifact) == _objects(first.artifact)  # byte for byte what was sealed


def test_n_spread_over_processes_gives_what_one_process_gives(tmp_path: Path) -> None:
    src = (REF / "rmsnorm.py").read_text()
    verdicts = {}
    for parts in (1, 3):
        with Judge(gpu=False, compile_workers=1, cache=CompileCache(tmp_path / str(parts))) as j:
            j.parts = parts
            verdicts[parts] = j.evaluate(src, get_op("rmsnorm"), "bfloat16", OPTS)
    one, three = verdicts[1], verdicts[3]
    assert one.status == three.status == "compiled", (one.message, three.message)
    assert one.compile.kernels_by_n == three.compile.kernels_by_n and one.compile.kernels == three.compile.kernels
    assert _objects(one.artifact) == _objects(three.artifact)


def test_a_damaged_entry_is_a_miss_and_another_source_another_key(judge: Judge, tmp_path: Path) -> None:
    cache = CompileCache(tmp_path)
    sig = {"tensors": [], "scalars": {}}
    k = key("source", sig, "bfloat16", 1024, "sm_90a")
    assert k != key("source ", sig, "bfloat16", 1024, "sm_90a") and k != key("source", sig, "bfloat16", 2048, "sm_90a")
    from llmcompile.harness.compile_cache import Entry

    cache.put(k, Entry(b"object", {"kernel": [128, 0]}))
    assert cache.get(k) is not None and cache.get(k).obj == b"object"
    (tmp_path / k / "n.o").write_bytes(b"tampered")
    assert cache.get(k) is None


def test_a_compile_error_is_not_kept(judge: Judge) -> None:
    from tests.bad_kernels import BAD

    (bad,) = [b for b in BAD if b.name == "does_not_compile"]
    for _ in range(2):
        v = judge.evaluate(bad.source(), get_op("softmax"), "bfloat16", OPTS)
        assert v.status == "compile_error" and "scale" in v.message, v.message
        assert v.compile is not None and v.compile.cached == []


def test_a_change_to_the_reference_kernels_is_another_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A candidate built on the row template (`reduce as R`) compiles to something else when the
    template or a tuned table changes, though its own source is the same: the key covers them."""
    import shutil

    from llmcompile.harness import compile_cache

    copy = tmp_path / "reference_kernels"
    shutil.copytree(REF, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = compile_cache.tree_hash(copy)
    assert before == compile_cache._kernels_code()  # (what it hashes is the sources alone)
    table = copy / "tuning" / "rows.py"
    table.write_text(table.read_text().replace("((None, True),)", "((None, False),)"))
    after = compile_cache.tree_hash(copy)
    assert after != before
    sig = {"tensors": [], "scalars": {}}
    k = key("source", sig, "bfloat16", 1024, "sm_90a")
    monkeypatch.setattr(compile_cache, "_kernels_code", lambda: after)
    assert key("source", sig, "bfloat16", 1024, "sm_90a") != k
