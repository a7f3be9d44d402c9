"""The offline provider's knob neighbourhood (the search's moves)."""

from __future__ import annotations

from pathlib import Path

from llmcompile.agent.offline import knobs_repr, neighbours
from reference_kernels.reduce import RowKnobs


def test_neighbours_change_one_thing_and_never_repeat_the_start() -> None:
    start = RowKnobs(row_loop=2, stage_smem=False)
    moves = neighbours(start, columns=True)
    reprs = [knobs_repr(k) for k in moves]
    assert knobs_repr(start) not in reprs
    assert len(set(reprs)) == len(reprs)
    assert RowKnobs(row_loop=2, stage_smem=False, columns="smem") in moves


def test_register_prefetch_is_a_move_only_while_looping() -> None:
    looping = neighbours(RowKnobs(row_loop=2, stage_smem=False))
    assert RowKnobs(row_loop=2, stage_smem=False, prefetch_registers=True) in looping
    assert not any(k.prefetch_registers for k in neighbours(RowKnobs()) if (k.row_loop or 1) == 1)


def test_attention_search_tries_each_tile_size_once_with_the_right_mask(tmp_path: Path) -> None:
    """Attention's offline default is its kernel as shipped, then its other tile sizes, then
    the Ampere kernel; each variant keeps the spec's causality and passes the static audit,
    and then it stops."""
    import os

    from llmcompile.agent.offline import ATTENTION_KNOBS, CAUSAL_ONLY, AttentionSearch, offline_provider
    from llmcompile.agent.providers import Slot
    from llmcompile.harness import static
    from llmcompile.specs import contract, get_op

    for op, causal in (("attention", False), ("attention_causal_d64", True)):
        spec = get_op(op)
        search = offline_provider(spec, "bfloat16")
        assert isinstance(search, AttentionSearch)
        answers = search.propose([], [Slot(r, s) for r in range(3) for s in range(4)])
        # (a head group of 1 is the non-causal default: offered on causal ops only)
        knob_sets = [k for k in ATTENTION_KNOBS if causal or k not in CAUSAL_ONLY]
        assert len(answers) == 2 + len(knob_sets) and not search.propose([], [Slot(3, 0)])
        assert "as shipped" in answers[0].text and "Ampere" in answers[-1].text
        sm80 = answers[-1].text.split("```python\n")[1].split("```")[0]
        assert static.check_source(sm80).ok and sm80.endswith(f"launch = AttentionSm80(causal={causal})\n")
        for a, knobs in zip(answers[1:], knob_sets, strict=False):
            src = a.text.split("```python\n")[1].split("```")[0]
            assert static.check_source(src).ok
            assert f"launch = Attention(causal={causal}, knobs=AttentionKnobs({knobs}))" in src
    # one variant end to end: it loads as a contract module and compiles for sm_90a
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    path = tmp_path / "variant.py"
    path.write_text(src)  # (the last tile-size variant)
    entry = contract.entry_of(contract.load_module(path))
    assert entry.causal and (entry.bn, entry.stages) == (64, 4)
    assert contract.compile_entry(entry, spec, "bfloat16", 1000) is not None
    assert entry.head_group(2) == 8  # the causal default at N = 1000
