"""The timed calls' checks (`harness/timed_calls.py`), with Python stand-ins for kernels: output sets
rotating against input sets, every set checked, then the nudged call right behind the timing,
against kernels that skip work while timed or keep their answers for the timed calls alone."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import torch

from llmcompile.harness import input_sets, timed_calls, verify
from llmcompile.harness.verdict import ProfileResult
from llmcompile.specs import get_op
from tests.stand_ins import SOFTMAX, Mapping, call_as_timed, past_end, profile_on_cpu, softmax


def test_timed_outputs_rotate_so_a_skipped_repeat_leaves_another_sets_answer() -> None:
    sets = input_sets.make_sets(SOFTMAX, 64, 256, "float32", count=3, device="cpu")
    assert call_as_timed(softmax, sets).check(sets.views) is None
    calls = [0]

    def skips_repeats(x, out):  # right on the first calls, then half the work
        calls[0] += 1
        softmax(x, out) if calls[0] <= 3 else softmax(x[:32], out[:32])

    bad = call_as_timed(skips_repeats, sets).check(sets.views)
    assert bad is not None and "last written from input set" in bad, bad


def test_timed_calls_that_change_an_input_or_write_past_it_are_caught() -> None:
    sets = input_sets.make_sets(SOFTMAX, 64, 256, "float32", count=2, device="cpu")

    def marks(x, out):
        softmax(x, out)
        x[0, 0] = x[0, 0] + 1e-3  # a tiny mark, within any tolerance of the answer

    timed = call_as_timed(marks, sets)
    assert "changed during the timed calls" in (timed.check(sets.views) or "")
    assert timed.check_kind == "input_modified"
    sets = input_sets.make_sets(SOFTMAX, 64, 256, "float32", count=2, device="cpu")

    def past(x, out):
        softmax(x, out)
        past_end(x).fill_(0.0)

    timed = call_as_timed(past, sets)
    assert "guard band of input `x`" in (timed.check(sets.views) or "")
    assert timed.check_kind == "out_of_bounds_write"


def test_every_timed_input_set_is_checked_not_only_the_first_and_last() -> None:
    """A kernel that skips work on the input sets between the first and the last (a judge that
    checks two sets of many sees nothing)."""
    sets = input_sets.make_sets(SOFTMAX, 64, 256, "float32", count=4, device="cpu")
    middle = {sets.views[1][0].data_ptr(), sets.views[2][0].data_ptr()}

    def skips_middle(x, out):
        softmax(x[:32], out[:32]) if x.data_ptr() in middle else softmax(x, out)

    bad = call_as_timed(skips_middle, sets).check(sets.views)
    assert bad is not None and "last written from input set" in bad, bad


def test_a_write_into_another_input_set_during_the_timed_calls_is_caught() -> None:
    sets = input_sets.make_sets(SOFTMAX, 64, 256, "float32", count=2, device="cpu")
    other = sets.views[1][0]

    def writes_elsewhere(x, out):
        softmax(x, out)
        if x.data_ptr() != other.data_ptr():
            other[5, 5] = 0.0  # into the set the next call reads

    timed = call_as_timed(writes_elsewhere, sets)
    assert "input `x` (set 1) changed during the timed calls" in (timed.check(sets.views) or "")


def test_the_number_of_timed_replays_is_not_known_in_advance() -> None:
    """A kernel counting its calls cannot tell which replay is the last, whose outputs are checked."""
    from llmcompile.bench import timing

    draws = {timing.replays(20) for _ in range(200)}
    assert min(draws) >= 20 and max(draws) < 20 + timing.REPS_SPREAD and len(draws) > 3


def test_a_kernel_wrong_on_every_call_is_told_wrong_not_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    def skips_half(x, out):
        softmax(x[:32], out[:32])

    checks = set()
    for seed in range(4):  # (the nudged call on either set, so its output set is checked first or last)
        monkeypatch.setattr(timed_calls.random, "SystemRandom", lambda seed=seed: random.Random(seed))
        p, _ = profile_on_cpu(monkeypatch, skips_half, Mapping())
        assert isinstance(p, ProfileResult) and p.failure is not None, p
        checks.add(p.failure.check)
    assert checks == {"timed_output"}


def test_a_nudge_moves_one_element_a_row_and_is_put_back_unless_the_context_is_lost() -> None:
    x = torch.randn(5, 7, dtype=torch.bfloat16)
    before = x.clone()
    nudge = timed_calls.Nudge.of([torch.zeros(3, dtype=torch.int64), x], random.Random(1))
    assert nudge is not None and sorted(int(w) // 7 for w in nudge.where) == [0, 1, 2, 3, 4]  # (5 rows < NUDGED_ROWS)
    with nudge.moved():
        assert int((x != before).sum()) == 5
    assert torch.equal(x.view(torch.int16), before.view(torch.int16))
    with pytest.raises(ValueError), nudge.moved():
        raise ValueError("the candidate's own error")
    assert torch.equal(x.view(torch.int16), before.view(torch.int16))
    with pytest.raises(RuntimeError), nudge.moved():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    assert not torch.equal(x, before)  # (the worker ends: no call may follow a fault)
    assert timed_calls.Nudge.of([torch.zeros(3, dtype=torch.int64)], random.Random(0)) is None
    many = timed_calls.Nudge.of([torch.randn(100, 3)], random.Random(2))
    assert many is not None and len({int(w) // 3 for w in many.where}) == timed_calls.NUDGED_ROWS


def _keeps_answers(per_row: bool) -> Callable:
    """A candidate that keeps each input set's answer (by its address and a sample: x[0, 0], or
    each row's x[r, 0]) and serves it again: what a kernel could do with its workspace while timed,
    where verification never looks (it poisons the workspace before each call)."""
    kept: dict = {}

    def kernel(x: torch.Tensor, out: torch.Tensor) -> None:
        for r in range(x.shape[0]) if per_row else [None]:
            rows = slice(r, r + 1) if per_row else slice(None)
            key = (x.data_ptr(), r, x[rows, 0].tolist())
            key = (key[0], key[1], tuple(key[2]))
            if key not in kept:
                softmax(x[rows], out[rows])
                kept[key] = out[rows].clone()
            out[rows] = kept[key]

    return kernel


@pytest.mark.parametrize(
    "per_row, dtype, n, move",
    [(False, "float32", 256, "+1"), (True, "float32", 256, "+1"), (True, "bfloat16", 1024, "+16")],
    ids=["sample_of_the_input", "sample_of_each_row", "bf16_row_of_1024"],
)
def test_answers_kept_from_the_timed_calls_are_stale_on_the_nudged_call(
    monkeypatch: pytest.MonkeyPatch, per_row: bool, dtype: str, n: int, move: str
) -> None:
    """bf16's bound on a softmax row of 1024 is wider than the change a +1 makes (0.008 against
    about 0.002): there the move grows until the old answer fails the check."""
    monkeypatch.setattr(timed_calls.random, "SystemRandom", lambda: random.Random(7))  # (the nudge's rows: fixed)
    sets = input_sets.make_sets(SOFTMAX, 64, n, dtype, count=2, device="cpu")
    p, _ = profile_on_cpu(monkeypatch, _keeps_answers(per_row), Mapping(), sets, dtype)
    assert isinstance(p, ProfileResult) and not p.ok and p.failure is not None, p
    assert p.failure.check == "stale" and "after the timed ones" in p.failure.detail, p.failure
    assert f"moved by {move} in place" in p.failure.detail, p.failure.detail
    assert sets.tampered() is None  # the nudge put back: the sets stay cached for the next candidate


def _ticking_checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The judge's float64 checks, each a tick of a stand-in kernel's clock (on a GPU it would read
    the GPU's): a call made after one is not "in quick succession". Returns the tick count."""
    ticks = [0]

    def ticking(check: Callable) -> Callable:
        def checked(*a: object, **k: object) -> object:
            ticks[0] += 1
            return check(*a, **k)

        return checked

    monkeypatch.setattr(verify, "compare_rows", ticking(verify.compare_rows))
    monkeypatch.setattr(verify.Reference, "check", ticking(verify.Reference.check))
    return ticks


def test_answers_served_only_to_calls_in_quick_succession_are_stale_on_the_nudged_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A kernel that keeps its answers and serves them only where its last call was moments ago
    (on a GPU it would read the clock): the judge's float64 checks between the timing and the
    nudged call stand for seconds here, each a tick of the kernel's clock. The timing's own work
    replayed, then a round, then the nudged call, meet it with no tick between."""
    ticks = _ticking_checks(monkeypatch)
    kept: dict = {}
    last_tick = [-1]
    served = [0]

    def in_quick_succession(x: torch.Tensor, out: torch.Tensor) -> None:
        quick, last_tick[0] = last_tick[0] == ticks[0], ticks[0]
        if quick and x.data_ptr() in kept:
            out.copy_(kept[x.data_ptr()])
            served[0] += 1
            return
        softmax(x, out)
        kept[x.data_ptr()] = out.clone()

    monkeypatch.setattr(timed_calls.random, "SystemRandom", lambda: random.Random(7))
    p, _ = profile_on_cpu(monkeypatch, in_quick_succession, Mapping())
    assert served[0] > 0  # (its answers served while timed: right there, the inputs unchanged)
    assert isinstance(p, ProfileResult) and p.failure is not None, p
    assert p.failure.check == "stale" and "right after the timed ones" in p.failure.detail, p.failure


def test_on_one_set_only_the_move_stands_between_the_two_calls_and_a_skipped_nudged_call_shows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A shape timed on one set (two did not fit): the timed calls all write the same outputs, so a
    kernel that skips its work when called again at once leaves the right answer there, and only
    the nudged call can see it. Nothing but the move may stand between the round's call and the
    nudged one (a poison would be a pass over an output too large for two sets: a gap a kernel
    reading the clock tells from the timed calls'); the skip shows all the same, as the answer
    to the unmoved inputs."""
    ticks, poisons = _ticking_checks(monkeypatch), [0]
    real_poison = verify.poison

    def poison(outs: list[torch.Tensor]) -> None:
        poisons[0] += len(outs)
        real_poison(outs)

    monkeypatch.setattr(verify, "poison", poison)
    last_tick, seen, skipped = [-1], [], [0]

    def skips_when_called_again_at_once(x: torch.Tensor, out: torch.Tensor) -> None:
        quick, last_tick[0] = last_tick[0] == ticks[0], ticks[0]
        seen.append(poisons[0])
        if quick:
            skipped[0] += 1
            return
        softmax(x, out)

    sets = input_sets.make_sets(SOFTMAX, 64, 256, "float32", count=1, device="cpu")
    p, _ = profile_on_cpu(monkeypatch, skips_when_called_again_at_once, Mapping(), sets)
    assert skipped[0] > 2 and seen[-1] == seen[-2], seen  # (the round's call, then the nudged one)
    assert isinstance(p, ProfileResult) and p.failure is not None, p
    assert p.failure.check == "stale" and "right after the timed ones" in p.failure.detail, p.failure
    sets = input_sets.make_sets(SOFTMAX, 64, 256, "float32", count=1, device="cpu")
    p, _ = profile_on_cpu(monkeypatch, softmax, Mapping(), sets)  # (its honest twin)
    assert isinstance(p, ProfileResult) and p.ok and "on one input set" in p.checks[0], p


def test_an_input_changed_during_the_nudged_calls_round_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The round's calls see read-only inputs, but a second, writable mapping of them exists then
    (the judge's, for the move): the sets are fingerprinted again after it."""
    calls = [0]

    def marks_late(x: torch.Tensor, out: torch.Tensor) -> None:
        calls[0] += 1
        softmax(x, out)
        if calls[0] == 8:  # (the timing's 2 x 2 calls, its replay's 2, then the round's second call)
            x[0, 0] += 1e-3

    p, _ = profile_on_cpu(monkeypatch, marks_late, Mapping())
    assert isinstance(p, ProfileResult) and p.failure is not None, p
    assert p.failure.check == "input_modified" and "after the nudged call" in p.failure.detail, p.failure


def test_an_honest_kernel_passes_the_nudged_call_and_the_sets_are_put_back(monkeypatch: pytest.MonkeyPatch) -> None:
    sets = input_sets.make_sets(SOFTMAX, 64, 256, "float32", count=2, device="cpu")
    before = [t.clone() for s in sets.views for t in s]
    as_made = {s[0].data_ptr(): s[0].clone() for s in sets.views}
    calls: list[tuple[int, bool]] = []

    def honest(x, out):
        calls.append((x.data_ptr(), torch.equal(x, as_made[x.data_ptr()])))
        softmax(x, out)

    p, _ = profile_on_cpu(monkeypatch, honest, Mapping(), sets)
    assert isinstance(p, ProfileResult) and p.ok, p
    assert "nudged call: 8 elements moved by +1, the timing replayed, then a round, eagerly" in p.checks[0], p.checks
    assert all(torch.equal(t, b) for t, b in zip((t for s in sets.views for t in s), before))
    # the timing's two calls a set, its replay, then a round (the nudged set first) and the nudged call
    assert len(calls) == 9, calls
    (first, as_made_1), (other, as_made_2), (last, moved_away) = calls[-3:]
    assert as_made_1 and as_made_2 and not moved_away  # (the move between the two calls on the set)
    assert first == last != other


def test_a_whole_shape_op_is_nudged_and_checked_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows not independent (a loss's sum over the rows): the nudged call tries the largest moves
    only, each checked against the whole shape's float64 reference."""
    # (the draw fixed: one in about 130 draws moves x[0, 0], the stand-in's cache key, and then it
    # answers the nudged call honestly, which is no stale answer to catch)
    monkeypatch.setattr(timed_calls.random, "SystemRandom", lambda: random.Random(7))
    spec = get_op("cross_entropy_total")
    scalars = list(spec.scalars.values())

    def honest(x, target, *outs_and_scalars):
        outs = outs_and_scalars[: len(spec.outputs)]
        for o, r in zip(outs, spec.run_reference([x, target], **spec.scalars)):
            o.copy_(r.reshape(o.shape).to(o.dtype))

    kept: dict = {}

    def keeps(x, target, *rest):
        key = (x.data_ptr(), float(x[0, 0]))
        if key not in kept:
            honest(x, target, *rest)
            kept[key] = [o.clone() for o in rest[: len(spec.outputs)]]
        for o, k in zip(rest, kept[key]):
            o.copy_(k)

    for fn, want in ((honest, None), (keeps, "stale")):
        sets = input_sets.make_sets(spec, 16, 64, "float32", count=2, device="cpu")
        timed = timed_calls.TimedCalls(fn, spec, 16, 64, "float32", scalars, sets)
        for _ in range(2):
            for s in sets.views:
                timed(*s)
        why = timed.check(sets.views)
        assert (timed.check_kind if why else None) == want, why
        assert "moved by +256" in timed.nudge_note or "moved by -256" in timed.nudge_note, timed.nudge_note
        assert sets.tampered() is None


@pytest.mark.gpu
def test_a_shape_on_one_set_gets_its_nudged_call_in_a_graph_on_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-set tail (the move alone between the two calls) as the GPU runs it: captured, and
    an honest kernel's answer to the moved inputs passes."""
    from llmcompile.harness import gpu_stages

    sets = input_sets.make_sets(SOFTMAX, 8192, 4096, "float32", count=1)
    monkeypatch.setattr(gpu_stages, "cached_sets", lambda *a, **k: sets)

    def kernel(x: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(torch.softmax(x, -1))

    try:
        sol = gpu_stages.device_bandwidth(None)
        p = gpu_stages.profile_candidate({4096: kernel}, SOFTMAX, "float32", [(8192, 4096)], sol, [])
        assert p.ok, p.failure
        assert "on one input set" in p.checks[0] and "then a round, in a graph" in p.checks[0], p.checks
        assert sets.tampered() is None
    finally:
        sets.release()
