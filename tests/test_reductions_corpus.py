"""The reductions corpus (evals/problems/reductions/, suite evals/suites/reductions.toml): every
problem the matcher takes compiles for sm_90a at its real size; the others are the gaps listed
here, each ending as the reason the matcher gives (issue 48)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmcompile.agent import patterns
from llmcompile.specs import get_op
from llmcompile.suites.suite import load_suite
from tests.level1 import compiled_match

ROOT = Path(__file__).resolve().parents[1]
CORPUS = sorted((ROOT / "evals/problems/reductions").glob("*.py"))

# what the matcher does not take yet, and the words its reason names it by
GAPS: dict[str, str] = {}


def test_the_suite_holds_the_whole_corpus() -> None:
    suite = load_suite(ROOT / "evals/suites/reductions.toml")
    assert len(CORPUS) >= 40 and len(suite.problems) == len(CORPUS)


@pytest.mark.parametrize("src", CORPUS, ids=[p.stem for p in CORPUS])
def test_each_problem_compiles_for_sm90a_or_says_why_not(src: Path, tmp_path: Path) -> None:
    spec = get_op(str(src))
    if src.stem in GAPS:
        m = patterns.match(spec)
        assert isinstance(m, patterns.NoMatch) and GAPS[src.stem] in m.reason, m
        return
    compiled_match(src, spec.dtypes[0], tmp_path)
