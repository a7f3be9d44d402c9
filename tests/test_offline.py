"""The offline provider's knob neighbourhood (the search's moves)."""

from __future__ import annotations

from llmcompile.offline import knobs_repr, neighbours
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
