"""`llmcompile coverage`: every form put to the matcher ends as a template or a reason, and
docs/coverage.md is what the matcher says now (the table is generated, never kept by hand)."""

from __future__ import annotations

from pathlib import Path

from llmcompile.agent import coverage

DOC = Path(__file__).resolve().parents[1] / "docs" / "coverage.md"


def test_every_form_ends_as_a_template_or_a_reason() -> None:
    cells = coverage.survey(("float32",))
    assert len(cells) == coverage.count(("float32",))
    assert all(bool(c.pattern) != bool(c.reason) for c in cells)
    taken = {(c.form, c.where): c.pattern for c in cells}
    assert taken[("sum", "middle")] == "strided"
    assert taken[("sum of the whole tensor, x.sum()", "")] == "total"
    assert taken[("an epilogue: x / amax(|x|) * 127, last dim", "")] == "norm"
    assert taken[("logsumexp", "last")] is None


def test_the_table_marks_what_is_not_taken_and_why() -> None:
    cells = [
        coverage.Cell("sum", "last", "float32", None, "no template takes a reduction along the last dim"),
        coverage.Cell("sum", "middle", "float32", "strided", ""),
        coverage.Cell("sum", "middle", "bfloat16", None, "a reason for bf16 alone"),
    ]
    text = coverage.table(cells)
    assert "| sum | - (1) | strided except bfloat16; - (2) |" in text
    assert "(1) no template takes a reduction along the last dim" in text
    assert "1 of 3 problems taken" in text


def test_docs_coverage_is_what_the_matcher_says_now() -> None:
    assert DOC.read_text() == coverage.document(coverage.survey()), (
        "docs/coverage.md is stale: run `llmcompile coverage --out docs/coverage.md`"
    )
