"""The attention_tf32 family: scaled_dot_product_attention of fp32 inputs with wide heads and
short rows (patterns/attention.py -> prompts/candidates/attention_tf32.py.j2 ->
reference_kernels/attention_tf32.py)."""

from __future__ import annotations

from pathlib import Path

from llmcompile.agent import patterns
from llmcompile.specs import get_op
from tests.level1 import compiles, needs_level1, problem


def _attention_file(tmp_path: Path, name: str, call: str, shape: str, dtype: str = "torch.float32") -> Path:
    f = tmp_path / f"{name}.py"
    f.write_text(
        "import torch\nimport torch.nn.functional as F\nfrom torch import nn\n\nclass Model(nn.Module):\n"
        f"    def forward(self, q, k, v):\n        return {call}\n\n"
        f"def get_inputs():\n    return [torch.rand{shape}.to({dtype}) for _ in range(3)]\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    return f


def test_attention_matches_only_what_the_fp32_kernel_computes(tmp_path: Path) -> None:
    """SDPA with a scale of its own reaches the kernel; a mask, causality, another dtype or a
    shape the kernel does not take is not attempted, and says which."""
    plain = _attention_file(tmp_path, "a", "F.scaled_dot_product_attention(q, k, v, scale=0.5)", "(2, 4, 128, 256)")
    m = patterns.match(get_op(str(plain)))
    assert isinstance(m, patterns.Match) and m.pattern == "attention_tf32" and "SCALE = 0.5" in m.source
    default = patterns.match(
        get_op(str(_attention_file(tmp_path, "b", "F.scaled_dot_product_attention(q, k, v)", "(2, 4, 128, 256)")))
    )
    assert "SCALE = 0.0625" in default.source  # 1 / sqrt(256)
    for name, call, shape, dtype, why in [
        (
            "c",
            "F.scaled_dot_product_attention(q, k, v, is_causal=True)",
            "(2, 4, 128, 256)",
            "torch.float32",
            "is_causal",
        ),
        ("d", "F.scaled_dot_product_attention(q, k, v)", "(2, 4, 1024, 256)", "torch.float32", "at most 512"),
        ("e", "F.scaled_dot_product_attention(q, k, v)", "(2, 4, 128, 96)", "torch.float32", "head dim 96"),
        ("f", "F.scaled_dot_product_attention(q, k, v)", "(2, 4, 128, 256)", "torch.bfloat16", "fp32"),
    ]:
        m = patterns.match(get_op(str(_attention_file(tmp_path, name, call, shape, dtype))))
        assert isinstance(m, patterns.NoMatch) and why in m.reason, (name, m)


@needs_level1
def test_attention_problem_prompt_carries_the_fp32_kernel() -> None:
    from llmcompile.agent.prompting import PromptContext, task_prompt
    from llmcompile.specs.targets import get_target

    text = task_prompt(PromptContext(problem(97), "float32", get_target("h100"), 90.0))
    assert "class AttentionTf32" in text and "A.launch(_heads(in0)" in text


@needs_level1
def test_kernel_compiles_for_sm90a(tmp_path: Path) -> None:
    compiles(97, tmp_path, "attention_tf32")
