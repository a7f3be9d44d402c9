"""CPU (CI): patterns/folds.joint_fold, several reductions of one dim as one fold of a tuple:
which combine, where each statistic reads its slots, and what is refused."""

from __future__ import annotations

import pytest

from llmcompile.agent.patterns.folds import joint_fold
from llmcompile.agent.patterns.graph import Unsupported

# (combine, identity, prologue, statistic) as reduction_parts gives them for an element `x`
SUM = ("S.add", "0.0,", "x", "acc[0]")
COUNT = ("S.add", "0.0,", "Float32(1.0)", "acc[0]")
AMAX = ("S.fmax", "-math.inf,", "x", "acc[0]")
LSE = ("S.max_sumexp", "-math.inf, 0.0,", "x, Float32(1.0)", "acc[0] + cute.math.log(acc[1])")
VAR = ("S.count_mean_m2", "0.0, 0.0, 0.0,", "Float32(1.0), x, Float32(0.0)", "acc[2] * 0.5")
MEAN = ("S.add", "0.0,", "x", "acc[0] * 0.25")
ARGMAX = ("S.argmax", "-math.inf, 0.0,", "x, Float32(r)", "acc[1]")


def test_sums_add_slot_by_slot() -> None:
    assert joint_fold([SUM, COUNT], ["sum", "sum"]) == ("S.add", "0.0, 0.0,", "x, Float32(1.0)", ["acc[0]", "acc[1]"])


def test_other_folds_sit_side_by_side_each_reading_its_own_slots() -> None:
    combine, identity, prologue, stats = joint_fold([AMAX, LSE], ["amax", "logsumexp"])
    assert combine == "S.joint((S.fmax, (-math.inf,)), (S.max_sumexp, (-math.inf, 0.0,)))"
    assert identity == "-math.inf, -math.inf, 0.0," and prologue == "x, x, Float32(1.0)"
    assert stats == ["acc[0]", "acc[1] + cute.math.log(acc[2])"]


def test_the_same_values_take_the_one_fold_that_yields_them_all() -> None:
    # a variance and a mean of x: one Chan merge, the mean its second slot (not a fourth slot)
    combine, identity, prologue, stats = joint_fold([VAR, MEAN], ["var", "mean"], element="x")
    assert (combine, identity, prologue) == ("S.count_mean_m2", "0.0, 0.0, 0.0,", "Float32(1.0), x, Float32(0.0)")
    assert stats == ["acc[2] * 0.5", "acc[1]"]
    # of different values the same two do not fit one fold's slots
    with pytest.raises(Unsupported, match="up to 3 values"):
        joint_fold([VAR, MEAN], ["var", "mean"])


def test_an_index_beside_another_fold_is_refused() -> None:
    with pytest.raises(Unsupported, match="no index"):
        joint_fold([ARGMAX, SUM], ["argmax", "sum"])


def test_a_norm_of_any_positive_p_is_a_root_of_a_sum_of_powers() -> None:
    from llmcompile.agent.patterns.folds import as_reduce, norm_as_sum
    from llmcompile.agent.patterns.graph import Op

    def norm(p: object) -> Op:
        return Op(None, "norm", [None], {"p": p})  # type: ignore[arg-type]

    a = "cute.math.abs({x})"
    assert norm_as_sum(norm(3))[:2] == (f"({a} * {a} * {a})", "cute.math.pow({s}, Float32(0.3333333333333333))")
    assert norm_as_sum(norm(0.5))[:2] == (f"(cute.math.pow({a}, Float32(0.5)))", "cute.math.pow({s}, Float32(2.0))")
    assert as_reduce(norm(float("-inf"))) == ("amin", a, "{s}")
    for p in (0, -1, float("nan")):  # (a count of nonzeros; a negative power; not a number)
        with pytest.raises(Unsupported, match="norm p="):
            norm_as_sum(norm(p))
