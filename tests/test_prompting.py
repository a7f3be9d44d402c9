"""CPU (CI): what the feedback tells the model matches what the judge checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmcompile.agent.loop import Best
from llmcompile.agent.prompting import feedback_prompt
from llmcompile.harness.verdict import CheckFailure, CompileResult, ProfileResult, Verdict, VerifyResult


def _verdict(status: str, **stages) -> Verdict:
    return Verdict(status, "msg", "softmax", "bfloat16", "h100", "sha", compile=CompileResult(True, [1024]), **stages)


def test_compile_only_feedback_claims_neither_correctness_nor_speed() -> None:
    v = _verdict("compiled")
    text = feedback_prompt(v, Best("c00_00", 0.0, 0.0, "src", v), 90.0)
    assert "not run" in text and "compiled only" in text
    assert "correct" not in text and "at 0.0%" not in text and "checked runs" not in text


def test_wrong_timed_output_is_fed_back() -> None:
    fail = CheckFailure("timed_output", 262144, 1024, "random", 0, "input set 0: 10486 rows never written")
    v = _verdict("wrong", verify=VerifyResult(True, 40), profile=ProfileResult(False, 3.0, failure=fail))
    v.message = "the outputs of the timed calls are wrong: " + fail.describe()
    text = feedback_prompt(v, None, 90.0)
    assert "timed calls are wrong" in text and "M=262144" in text


def test_verified_but_untimed_says_so() -> None:
    v = _verdict("verified", verify=VerifyResult(True, 12))
    text = feedback_prompt(v, None, 90.0)
    assert "correct (12 checked runs); it was not timed" in text


def test_custom_problem_prompt_carries_its_pattern_template() -> None:
    """A problem whose graph is a middle-dim reduction gets the strided template and the
    kernel written from its graph, not the row-reduction template."""
    from pathlib import Path

    from llmcompile.agent.prompting import PromptContext, task_prompt
    from llmcompile.specs import get_op
    from llmcompile.specs.targets import get_target

    spec = get_op(str(Path(__file__).resolve().parents[1] / "evals" / "problems" / "mean_dim1.py"))
    text = task_prompt(PromptContext(spec, "float32", get_target("h100"), 90.0))
    assert "The strided template this problem's graph matches" in text
    assert "class StridedReduce" in text and "S.StridedReduce(" in text
    assert "The row template you may import" not in text
    builtin = task_prompt(PromptContext(get_op("softmax"), "bfloat16", get_target("h100"), 90.0))
    assert "The row template you may import" in builtin


def test_the_row_template_is_shown_as_its_interface() -> None:
    """Every public name of the row template's three modules is in the prompt with its
    signature and docstring (an answer calls them as R.name); long bodies are not (the
    cluster reduction's inline PTX, the tiling's search); short combines are whole; what is
    shown still parses."""
    import ast

    from llmcompile.agent.prompting import ROW_TEMPLATE, PromptContext, task_prompt, template_source
    from llmcompile.agent.render import reference_source
    from llmcompile.specs import get_op
    from llmcompile.specs.targets import get_target
    from reference_kernels import reduce as R

    shown = template_source("reduce")
    for module in ROW_TEMPLATE:
        part = shown.split(f"# ---- reference_kernels/{module}.py\n")[1].split("# ---- reference_kernels/")[0]
        ast.parse(part)
        for node in ast.parse(reference_source(module)).body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef) and not node.name.startswith("_"):
                assert f"def {node.name}(" in part or f"class {node.name}" in part, (module, node.name)
                doc = ast.get_docstring(node)
                if doc:
                    assert doc.splitlines()[0] in part, (module, node.name)
                assert hasattr(R, node.name), (module, node.name)  # one import gives them all
        assert len(part) < 0.8 * len(reference_source(module)), module
    assert "st.async.shared::cluster" not in shown  # (_remote_store: private, left out)
    assert "while per_thread(tpr, cluster) * arrays > REGISTER_VALUES" not in shown  # resolve_tiling's body
    assert "return tuple(x + y for x, y in zip(a, b))" in shown  # add, whole
    softmax = task_prompt(PromptContext(get_op("softmax"), "bfloat16", get_target("h100"), 90.0))
    assert shown in softmax and "class Softmax" in softmax
    assert len(softmax) < 40_000  # (59,031 characters when reduce.py was pasted whole)


def test_an_offline_variant_of_a_kernel_with_a_workspace_takes_it_and_compiles(tmp_path) -> None:
    """The norms' backward keep their partial sums in the contract's workspace: the search's
    per-N variant passes it through (it once called the kernel without it)."""
    from llmcompile.agent import prompting
    from llmcompile.specs import contract, get_op

    spec = get_op("rmsnorm_bwd")
    src = prompting.offline_variant(spec, {1024: "RowKnobs(columns='late')"}, "t")
    assert "def launch(mDy, mX, mWeight, mRstd, mDx, mDw, mWork, stream)" in src
    path = tmp_path / "variant.py"
    path.write_text(src)
    mod = contract.load_module(path)
    assert contract.workspace_of(mod) > 0
    for n in (1024, 4096):  # the variant's own knobs, and the reference's for other N
        assert contract.compile_entry(contract.entry_of(mod), spec, "bfloat16", n, workspace=contract.workspace_of(mod))


def test_attention_prompts_speak_of_the_tensor_cores_and_flops() -> None:
    """A compute-bound op is asked for, and told about, TFLOP/s against the GEMM probe, never
    the copy bandwidth; its task carries the reference attention kernel."""
    from llmcompile.agent.loop import Best
    from llmcompile.agent.prompting import PromptContext, system_prompt, task_prompt
    from llmcompile.harness.verdict import ShapeTiming
    from llmcompile.specs import get_op
    from llmcompile.specs.targets import get_target

    ctx = PromptContext(get_op("attention_causal"), "bfloat16", get_target("h100"), 75.0, sol_tbs=757.0)
    system, task = system_prompt(ctx), task_prompt(ctx)
    assert "GEMM (cuBLAS) measures 757 TFLOP/s" in system and "warpgroup" in system
    assert "copy bandwidth" not in system and "copy bandwidth" not in task
    assert "16 x 16384: 1099.5 GFLOP" in task and "75.0% of the dense GEMM throughput" in task
    assert "class Attention:" in task and "from reference_kernels.attention import Attention" in task
    shape = ShapeTiming(16, 16384, 3.1, 350.0, 46.2, True)
    v = Verdict("profiled", "msg", "attention_causal", "bfloat16", "h100", "sha", compile=CompileResult(True, [16384]),
                verify=VerifyResult(True, 40), profile=ProfileResult(True, 757.0, 757.0, [shape], unit="TFLOP/s"))  # fmt: skip
    text = feedback_prompt(v, Best("c00_00", 46.2, 46.2, "src", v), 75.0)
    assert "(dense GEMM 757.000 TFLOP/s)" in text and "| M x N | ms | TFLOP/s | % of GEMM |" in text
    assert "46.2% of the dense GEMM" in text and "75.0% of the dense GEMM throughput" in text
    assert "copy" not in text


ANSWERS = Path(__file__).resolve().parents[2] / "shared" / "llm-answers"


@pytest.mark.skipif(not ANSWERS.is_dir(), reason=f"the LLM answers are not beside the checkout ({ANSWERS})")
@pytest.mark.parametrize("answer", ["l1norm-answer-1.md", "l1norm-answer-2.md"])
def test_answers_an_llm_wrote_against_the_row_template_still_compile(answer: str, tmp_path: Path) -> None:
    """Two answers a model wrote to our prompt (shared/llm-answers) call the template as R.name:
    after the template's split into row_plan, row_io and reduce they pass the static check and
    compile for sm_90a as they did."""
    from llmcompile.agent.prompting import extract_code
    from llmcompile.harness import static
    from llmcompile.specs import contract, get_op

    code = extract_code((ANSWERS / answer).read_text())
    assert code and static.check_source(code).ok
    level1 = ANSWERS.parent / "kernelbench" / "level1" / "38_L1Norm_.py"
    if not level1.is_file():
        pytest.skip("KernelBench level 1 is not beside the checkout")
    spec = get_op(str(level1))
    path = tmp_path / "answer.py"
    path.write_text(code)
    mod = contract.load_module(path)
    (_, n) = spec.fixed_shapes[0]
    assert contract.compile_entry(contract.entry_of(mod), spec, "float32", n, workspace=contract.workspace_of(mod))


@pytest.mark.parametrize(
    ("forward", "template"),
    [
        ("torch.softmax(x, dim=-1)", "softmax"),  # the rows wrapper: the reference kernel's own file
        ("torch.log_softmax(x, dim=0)", "leading"),
        ("torch.count_nonzero(x > 0.5, dim=1)", "strided"),
    ],
)
def test_every_template_a_match_names_has_its_source_in_the_prompt(forward: str, template: str, tmp_path: Path) -> None:
    """(A 3-D softmax once named a template file that does not exist, and its eval problem failed.)"""
    from llmcompile.agent.prompting import PromptContext, task_prompt, template_for
    from llmcompile.specs import get_op
    from llmcompile.specs.targets import get_target
    from tests.level1 import problem_file

    spec = get_op(str(problem_file(tmp_path, "p", forward, "(64, 32, 256)")))
    assert template_for(spec)[0] == template
    text = task_prompt(PromptContext(spec, "float32", get_target("h100"), 90.0))
    assert (Path(__file__).resolve().parents[1] / "reference_kernels" / f"{template}.py").read_text()[:200] in text
