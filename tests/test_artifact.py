"""CPU (CI): sealing a compiled host module into the artifact, and what sealing refuses."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from llmcompile.harness import Judge, JudgeOptions
from llmcompile.runtime import artifact, seal
from llmcompile.specs import contract, get_op

REF = Path(__file__).resolve().parents[1] / "reference_kernels"


@pytest.fixture(scope="module")
def host_module() -> str:
    """The host module CuTe DSL makes of the reference softmax (bf16, N=1024), as text."""
    entry = contract.entry_of(contract.load_module(REF / "softmax.py"))
    return str(contract.compile_entry(entry, get_op("softmax"), "bfloat16", 1024).ir_module)


def with_function(text: str, code: str) -> str:
    body = text.rstrip()
    assert body.endswith("}")
    return body[:-1] + code + "\n}\n"


EVIL = {
    "a libc call": (
        "  llvm.func @system(!llvm.ptr) -> i32\n"
        "  llvm.func @evil(%arg0: !llvm.ptr) -> i32 {\n"
        "    %0 = llvm.call @system(%arg0) : (!llvm.ptr) -> i32\n"
        "    llvm.return %0 : i32\n  }",
        "external function `system`",
    ),
    "inline assembly": (
        "  llvm.func @evil() -> i64 {\n"
        '    %0 = llvm.inline_asm has_side_effects "syscall", "=r" : () -> i64\n'
        "    llvm.return %0 : i64\n  }",
        "llvm.inline_asm",
    ),
    "an indirect call": (
        "  llvm.func @evil(%arg0: !llvm.ptr) -> i32 {\n"
        "    %0 = llvm.call %arg0() : !llvm.ptr, () -> i32\n"
        "    llvm.return %0 : i32\n  }",
        "indirect call",
    ),
    "a load-time constructor": (
        "  llvm.func @evil() {\n    llvm.return\n  }\n"
        "  llvm.mlir.global_ctors ctors = [@evil], priorities = [0 : i32], data = [#llvm.zero]",
        "global_ctors",
    ),
}


def test_seal_exports_one_entry_under_our_name(host_module: str, tmp_path: Path) -> None:
    obj, launches = seal.seal(host_module, 1024)
    assert obj[:4] == b"\x7fELF" and len(launches) == 1
    threads, smem = next(iter(launches.values()))
    assert threads > 0 and smem >= 0
    man = artifact.ArtifactManifest(
        "softmax", "bfloat16", {"1024": "n1024.o"}, {"1024": artifact.SYMBOL.format(n=1024)},
        {"n1024.o": artifact.sha256(obj)},
    )  # fmt: skip
    artifact.write(tmp_path, man, {"n1024.o": obj})
    got, fns = artifact.load_functions(tmp_path)  # loads on a machine without a GPU too
    assert got == man and set(fns) == {1024}


@pytest.mark.parametrize("what", sorted(EVIL))
def test_seal_refuses_host_code_cute_dsl_never_emits(host_module: str, what: str) -> None:
    code, why = EVIL[what]
    with pytest.raises(artifact.ArtifactError, match="refused") as e:
        seal.seal(with_function(host_module, code), 1024)
    assert why in str(e.value)


def test_seal_refuses_text_that_is_not_a_module() -> None:
    with pytest.raises(artifact.ArtifactError, match="does not parse"):
        seal.seal("import os; os.system('id')", 1024)


def test_a_tampered_object_is_not_loaded(host_module: str, tmp_path: Path) -> None:
    obj, _ = seal.seal(host_module, 1024)
    man = artifact.ArtifactManifest(
        "softmax", "bfloat16", {"1024": "n1024.o"}, {"1024": "llmcompile_n1024"}, {"n1024.o": artifact.sha256(obj)}
    )
    bad = bytearray(obj)
    bad[len(bad) // 2] ^= 0xFF
    artifact.write(tmp_path, man, {"n1024.o": bytes(bad)})
    with pytest.raises(artifact.ArtifactError, match="does not match"):
        artifact.load_functions(tmp_path)
    data = json.loads((tmp_path / "manifest.json").read_text())
    (tmp_path / "manifest.json").write_text(json.dumps({**data, "format": 99}))
    with pytest.raises(artifact.ArtifactError, match="format"):
        artifact.read(tmp_path)


def test_judge_writes_the_artifact_and_best_loads_it(tmp_path: Path) -> None:
    from llmcompile.agent.runs import RunStore
    from llmcompile.loader import load

    opts = JudgeOptions(stages=("static", "compile"), profile_shapes=[(64, 1024)], verify_ns=[1024, 5001])
    with Judge(gpu=False, compile_workers=1) as j:
        v = j.evaluate((REF / "softmax.py").read_text(), get_op("softmax"), "bfloat16", opts)
        assert v.status == "compiled" and v.artifact, v.message
        man = artifact.read(v.artifact)
        assert set(man.objects) == {"1024", "5001"} and man.tensors == ["x", "out"] and man.op == "softmax"
        store = RunStore(tmp_path / "run")
        best = store.write_best("softmax", (REF / "softmax.py").read_text(), {"op_ref": "softmax"}, v.artifact)
    fn = load(best)  # the judge's temp artifacts are gone: best/ has its own copy
    assert {n for _, n in fn._compiled} == {1024, 5001} and fn.compiler is None
    with pytest.raises(Exception, match="this artifact has kernels for"):
        fn.compiled("bfloat16", 2048)


@pytest.mark.gpu
def test_a_loaded_artifact_computes_softmax_on_the_gpu(tmp_path: Path) -> None:
    """What `best/` ships runs without the candidate's Python: sealed objects, loaded and called."""
    import torch

    from llmcompile.loader import load

    opts = JudgeOptions(stages=("static", "compile"), profile_shapes=[(64, 4096)], verify_ns=[4096])
    with Judge(gpu=False, compile_workers=1) as j:
        v = j.evaluate((REF / "softmax.py").read_text(), get_op("softmax"), "bfloat16", opts)
        assert v.artifact, v.message
        shutil.copytree(v.artifact, tmp_path / "artifact")
    fn = load(tmp_path)
    x = torch.randn(333, 4096, device="cuda", dtype=torch.bfloat16)
    want = torch.softmax(x.double(), -1)
    assert torch.allclose(fn(x).double(), want, atol=1e-2, rtol=0)
    assert hasattr(torch.ops.llmcompile, fn.op_name)  # registered as a torch.library op
    assert torch.allclose(fn(x[:1]).double(), want[:1], atol=1e-2, rtol=0)  # M = 1


LEVEL1 = Path(__file__).resolve().parents[2] / "shared" / "kernelbench" / "level1"


@pytest.mark.skipif(not LEVEL1.is_dir(), reason="KernelBench level 1 not beside the checkout")
def test_a_kernel_with_a_workspace_gets_it_recorded_and_bound(tmp_path: Path) -> None:
    """Kernel contract rule 6: the module's WORKSPACE reaches the manifest, and the loaded
    function takes the problem's tensors alone (the scratch is bound after the outputs)."""
    from llmcompile.agent import patterns
    from llmcompile.specs import contract
    from reference_kernels import total as T

    spec = get_op(str(LEVEL1 / "94_MSELoss.py"))
    src = patterns.match(spec).source
    with Judge(gpu=False, compile_workers=1) as j:
        v = j.evaluate(src, spec, None, JudgeOptions(stages=("static", "compile")))
        assert v.status == "compiled" and v.artifact, v.message
        assert v.compile.workspace == T.WORKSPACE
        man = artifact.read(v.artifact)
        assert man.workspace == T.WORKSPACE and man.tensors == ["in0", "in1", "out"]
        _, fns = artifact.load_functions(v.artifact)
        objects = {name: (Path(v.artifact) / name).read_bytes() for name in man.objects.values()}
    (fn,) = fns.values()
    assert isinstance(fn, contract.WithWorkspace) and fn.n_tensors == 3 and fn.elems == T.WORKSPACE
    with pytest.raises(ValueError, match="WORKSPACE"):
        contract.check_workspace(contract.MAX_WORKSPACE + 1)
    man.workspace = -4  # a manifest is data: a bad one is refused, not allocated
    artifact.write(tmp_path, man, objects)
    with pytest.raises(artifact.ArtifactError, match="WORKSPACE"):
        artifact.load_functions(tmp_path)
