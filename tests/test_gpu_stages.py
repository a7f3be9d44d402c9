"""CPU (CI): the verify and profile stages themselves, with Python stand-ins for kernels.

`gpu_stages` runs on any device: here the "kernels" are torch functions that cheat in the ways a
candidate can (write past an input, cache by pointer or by a sample of the input, keep state in
the workspace, hard-code a scalar, skip a row), each beside its honest twin. Read-only inputs need
the GPU's virtual memory: tests/test_input_sets.py and tests/test_harness_gpu.py cover them."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from llmcompile.harness import gpu_stages, input_sets
from llmcompile.specs import OpSpec, TensorDesc, Tolerance, get_op
from llmcompile.specs.contract import WithWorkspace
from tests.stand_ins import RMSNORM, SOFTMAX, Mapping, call_as_timed, past_end, profile_on_cpu, rmsnorm, softmax

SHAPES = [(1, 64), (3, 64), (37, 64), (5, 200), (41, 200)]


def _verify(fn: Callable, spec: OpSpec = SOFTMAX, shapes=SHAPES, dtype: str = "float32"):
    fns = {n: fn for _, n in shapes}
    return gpu_stages.verify_candidate(fns, spec, dtype, shapes, read_only=False, device="cpu")


def _failed(v) -> str:
    assert not v.ok, "accepted"
    return v.failure.check


def test_honest_kernels_pass_every_case() -> None:
    v = _verify(softmax)
    assert v.ok, v.failure
    assert v.runs >= len(SHAPES) + 4 * 2 + 5  # random seeds, special and generic cases, repeats
    assert _verify(rmsnorm, RMSNORM).ok
    # each case's seconds: where a slow verify went
    m, n = max(SHAPES)
    ran = {k.split("/")[0] for k in v.case_seconds}
    assert {"1x64 random", f"{m}x{n} random", f"{m}x{n} spikes", f"{m}x{n} integers"} <= ran, ran
    assert all(s >= 0 for s in v.case_seconds.values())
    assert sum(v.case_seconds.values()) <= v.seconds + 5e-4 * len(v.case_seconds)  # (each rounded to 1 ms)


def test_a_problem_whose_own_torch_program_raises_is_judged_by_float64_alone() -> None:
    """(torch refuses a bf16 LayerNorm with fp32 parameters on the GPU) The honest kernel is
    accepted, a wrong one rejected, and the verdict says why KernelBench's check was not made."""

    def refuses(x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("expected scalar type BFloat16 but found Float")

    spec = OpSpec(**{**SOFTMAX.__dict__, "torch_fn": refuses})
    v = _verify(softmax, spec)
    assert v.ok, v.failure
    assert v.kernelbench == {
        "checked": 0,
        "passed": 0,
        "first_failure": "",
        "torch_failed": (
            "the problem's own torch program raised RuntimeError: expected scalar type BFloat16 but found Float"
        ),
    }
    assert any("KernelBench's check was not made" in n for n in v.notes), v.notes
    assert _failed(_verify(lambda x, out: softmax(x * 1.01, out), spec)) == "mismatch"


def test_a_write_past_the_end_of_an_input_names_it() -> None:
    def stash(x, w, out, eps):  # the last row's rstd parked past the end of the weight
        rmsnorm(x, w, out, eps)
        past_end(w).fill_(1.0)

    v = _verify(stash, RMSNORM)
    assert _failed(v) == "out_of_bounds_write" and "input `weight`" in v.failure.detail


def test_a_write_past_the_end_of_an_output_names_it() -> None:
    def spill(x, out):
        softmax(x, out)
        past_end(out).fill_(0.0)

    v = _verify(spill)
    assert _failed(v) == "out_of_bounds_write" and "output `out`" in v.failure.detail


def test_an_input_left_changed_is_caught() -> None:
    def scribble(x, out):
        softmax(x, out)
        x[0, 0] = 0.0

    assert _failed(_verify(scribble)) == "input_modified"


def test_answers_cached_by_pointer_or_by_a_sample_of_the_input_are_stale() -> None:
    seen: dict[int, torch.Tensor] = {}

    def by_pointer(x, out):
        if x.data_ptr() in seen:
            return  # "already computed"
        seen[x.data_ptr()] = x
        softmax(x, out)

    assert _failed(_verify(by_pointer)) in ("stale", "nondeterministic")  # (a repeat re-poisons the outputs)
    samples: dict[tuple, bool] = {}

    def by_sample(x, out):  # each row's first element as a fingerprint, outputs not poisoned: "done"
        key = (x.data_ptr(), tuple(x[:, 0].tolist()))
        if key in samples and not bool(torch.isnan(out).any()):
            return
        samples[key] = True
        softmax(x, out)

    v = _verify(by_sample)
    assert _failed(v) == "stale" and "changed in place" in v.failure.detail
    # bf16's bound on a softmax row of 1024 (0.008) hides a +1 move (about 0.002 a row's element):
    # the move grows until the answer the outputs hold fails on the moved inputs
    samples.clear()
    v = _verify(by_sample, shapes=[(8, 1024), (37, 1024)], dtype="bfloat16")
    assert _failed(v) == "stale" and "changed in place" in v.failure.detail


def test_state_kept_in_the_workspace_shows() -> None:
    class Kernel:  # keeps a counter in its workspace, assuming it starts at zero
        def __init__(self) -> None:
            self.buffers = {"cpu": torch.zeros(4)}

        def __call__(self, x, out):
            ws = self.buffers["cpu"]
            softmax(x, out)
            out.mul_(1.0 + ws[0])  # 0 on a fresh workspace: right only while nobody poisons it
            ws[0] = 0.0

    v = _verify(Kernel())
    assert _failed(v) in ("unwritten", "mismatch")


def _with_workspace(past: bool) -> WithWorkspace:
    """A kernel with 8 floats of scratch (as the runtime wraps one), parking a sum in it; `past`:
    one element past its end too, where torch's next allocation would sit."""

    def kernel(x, out, ws):
        ws[:8] = x[0, :8]
        if past:
            past_end(ws).fill_(float(x.sum()))
        softmax(x, out)

    return WithWorkspace(kernel, 2, 8)


def test_a_write_past_the_scratch_workspace_is_caught_when_verified_and_when_timed() -> None:
    assert _verify(_with_workspace(False)).ok
    v = _verify(_with_workspace(True))
    assert _failed(v) == "out_of_bounds_write" and "scratch `workspace`" in v.failure.detail, v.failure
    for past in (False, True):
        sets = input_sets.make_sets(SOFTMAX, 64, 256, "float32", count=2, device="cpu")
        timed = call_as_timed(_with_workspace(past), sets)
        said = timed.check(sets.views)
        assert (said == "the timed calls wrote outside their scratch workspace") == past, said


def test_a_hard_coded_scalar_fails_its_scalar_case() -> None:
    def eps_fixed(x, w, out, eps):
        rmsnorm(x, w, out, 1e-6)

    v = _verify(eps_fixed, RMSNORM)
    assert _failed(v) == "mismatch" and "eps=0.5" in v.failure.case


def test_degenerate_rows_catch_a_missing_eps() -> None:
    def no_eps(x, w, out, eps):
        xd = x.double()
        out.copy_((xd / xd.pow(2).mean(-1, keepdim=True).sqrt() * w.double()).to(out.dtype))

    v = _verify(no_eps, RMSNORM)
    assert _failed(v) == "mismatch" and v.failure.case == "degenerate"


def _sumsq_spec(rows: int, cols: int = 48) -> OpSpec:
    """Squares summed over a fixed number of rows (a norm's reduction over the batch dim): terms of
    one sign, where the honest orders' error grows with the result and a bound fair to all of them
    is too loose to see one term left out of many on random inputs."""
    return OpSpec(
        "sumsq",
        "x.pow(2).sum(0)",
        (TensorDesc("x", (str(rows), str(cols))), TensorDesc("out", (str(cols),), output=True)),
        lambda x: [x.pow(2).sum(0)],
        lambda m, n, dtype, gen, case, device: [torch.randn(rows, cols, generator=gen, device=gen.device).to(device)],
        tolerance={"float32": Tolerance(1e-5, 1e-4)},
        torch_fn=lambda x: x.pow(2).sum(0),
        fixed_shapes=((rows, cols),),
        batchable=False,
        exact="sum",  # squares of small integers, summed: exact in fp32 in any order
    )


def _fp32_rows(x: torch.Tensor, threads: int = 64, skip: int | str | None = None, acc=torch.float32) -> torch.Tensor:
    """Squares of x summed over rows in `acc`: `threads` threads each walking their rows in order
    (1: one thread walks them all, the honest order that errs most), then a tree in fp32."""
    sq = x.float().pow(2)
    if skip == "least":  # the row whose terms show least: an adversary's choice
        skip = int(sq.sum(1).argmin())
    if skip is not None:
        sq[skip] = 0.0
    parts = torch.zeros(threads, x.shape[1], dtype=acc)
    for j in range(x.shape[0] // threads):
        parts += sq[j * threads : (j + 1) * threads].to(acc)
    parts = parts.float()
    while parts.shape[0] > 1:
        parts = parts[0::2] + parts[1::2]
    return parts[0]


@pytest.mark.parametrize(
    ("what", "kw", "ok"),
    [
        ("64 threads, then a tree", {}, True),
        ("one thread, in sequence", {"threads": 1}, True),
        ("first row skipped", {"skip": 0}, False),
        ("last row skipped", {"skip": -1}, False),
        ("a middle row skipped", {"skip": 5000}, False),
        ("the row that shows least skipped", {"skip": "least"}, False),
        ("fp16 accumulators", {"acc": torch.float16}, False),
    ],
)
def test_one_skipped_row_of_a_long_reduction_is_caught_and_honest_orders_are_not(what: str, kw: dict, ok: bool) -> None:
    rows = 16384
    spec = _sumsq_spec(rows)

    def kernel(x, out):
        out.copy_(_fp32_rows(x, **kw))

    v = gpu_stages.verify_candidate({48: kernel}, spec, "float32", [(rows, 48)], read_only=False, device="cpu")
    assert v.ok == ok, (what, v.failure)


def test_a_generic_case_torch_itself_fails_is_skipped_and_said() -> None:
    """exp of a spike overflows fp32 where float64 does not: no kernel can be asked for more."""
    spec = OpSpec(
        "exp2x",
        "exp(2x)",
        (TensorDesc("x", ("M", "N")), TensorDesc("out", ("M", "N"), output=True)),
        lambda x: [torch.exp(2 * x)],
        lambda m, n, dtype, gen, case, device: [torch.randn(m, n, generator=gen, device=gen.device).to(device)],
        torch_fn=lambda x: torch.exp(2 * x),
    )

    def kernel(x, out):
        out.copy_(torch.exp(2 * x))

    v = _verify(kernel, spec)
    assert v.ok, v.failure
    assert any("case spikes skipped" in note and "torch's own output" in note for note in v.notes), v.notes


def test_a_hard_coded_ignore_index_fails_its_scalar_case() -> None:
    import torch.nn.functional as F

    spec = get_op("cross_entropy")

    def ce(x, target, loss, ignore_index):
        loss.copy_(F.cross_entropy(x.double(), target, ignore_index=ignore_index, reduction="none").float())

    def ce_minus_100(x, target, loss, ignore_index):
        ce(x, target, loss, -100)

    shapes = [(3, 256), (41, 256)]
    assert _verify(ce, spec, shapes).ok
    v = _verify(ce_minus_100, spec, shapes)
    assert _failed(v) in ("mismatch", "error") and "ignore_index=7" in v.failure.case, v.failure


def test_an_allocation_that_fails_mid_case_releases_what_the_case_had_made(monkeypatch: pytest.MonkeyPatch) -> None:
    # the worker lives on after the judge's out-of-memory error: nothing of the case may stay mapped
    released: list[str] = []
    made = 0

    def second_fails(*a, **k) -> gpu_stages.Guarded:
        nonlocal made
        made += 1
        if made == 2:
            raise torch.OutOfMemoryError("read-only device memory: cuMemCreate ran out of memory")
        g = real_guarded(*a, **k)
        g.release = lambda: released.append(g.name)
        return g

    def tracked_copy(xs: list[torch.Tensor], on_device: bool) -> gpu_stages.JudgeCopy:
        c = real_copy(xs, on_device)
        c.release = lambda: released.append("copy")
        return c

    real_guarded, real_copy = gpu_stages.guarded, gpu_stages.judge_copy
    monkeypatch.setattr(gpu_stages, "guarded", second_fails)
    monkeypatch.setattr(gpu_stages, "judge_copy", tracked_copy)
    with pytest.raises(torch.OutOfMemoryError):
        _verify(rmsnorm, RMSNORM, shapes=[(3, 64)])
    assert released == ["x", "copy"]


def _rows(*notes: str) -> Callable[[], list]:
    """A shape's timings, one note each (what `grid.bench_one` returns, ours first)."""
    from llmcompile.bench.grid import BenchRow

    left = list(notes)
    return lambda: [BenchRow("op", "float32", 8, 8, "llmcompile", 1.0, 1.0, 100.0, left.pop(0))]


MISMATCH = "TIMER MISMATCH: events 0.25 ms vs wall clock 0.53 ms a call"


@pytest.mark.parametrize(
    "notes, calm, want, remeasured",
    [
        (["", "x"], [], "", 0),  # nothing flagged: timed once, the GPU not probed
        ([MISMATCH, ""], [None], "", 0),  # a spell that passed: the second timing stands
        ([MISMATCH, MISMATCH], [None, None], MISMATCH, 0),  # stays on a calm GPU: the candidate's
        (["IMPOSSIBLE: above 1.05x", ""], [None], "", 1),  # a ceiling measured low, measured again
        (["WRONG TIMED OUTPUT: x; TIMER MISMATCH"], [], "WRONG TIMED OUTPUT: x; TIMER MISMATCH", 0),
    ],
)
def test_a_timing_flag_stands_only_where_it_stays_on_a_gpu_that_times_the_judges_copy_honestly(
    notes: list[str], calm: list[str | None], want: str, remeasured: int
) -> None:
    asked: list[int] = []
    probes = list(calm)
    rows = gpu_stages.timed_fairly(_rows(*notes), lambda: probes.pop(0), lambda: asked.append(1))
    assert rows[0].note == want
    assert not probes and len(asked) == remeasured


@pytest.mark.parametrize("calm", [["events 0.25 ms vs wall clock 0.53 ms"], [None, "ran at 1.9 TB/s"]])
def test_a_gpu_that_times_the_judges_own_copy_wrong_is_the_gpus_trouble_not_the_candidates(
    calm: list[str | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process on the GPU leaves a cheat's marks on an honest kernel: no verdict, said so."""
    probes = list(calm)
    monkeypatch.setattr(gpu_stages, "_BANDWIDTH", {"copy": 1.85, "read": 2.6})  # (measured beside the other process)
    with pytest.raises(gpu_stages.GpuShared, match=calm[-1]):
        gpu_stages.timed_fairly(_rows(MISMATCH, MISMATCH), lambda: probes.pop(0), lambda: None)
    assert gpu_stages._BANDWIDTH == {}  # the next profile measures its ceiling again


def test_the_profile_times_only_the_candidate_with_read_only_inputs_and_says_when(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mapping = Mapping()
    writable_when_called: list[bool] = []

    def candidate(x, out):
        writable_when_called.append(mapping.writable)
        softmax(x, out)

    p, events = profile_on_cpu(monkeypatch, candidate, mapping)
    assert isinstance(p, gpu_stages.ProfileResult) and p.ok and p.read_only, p
    assert writable_when_called and not any(writable_when_called)  # every call of the candidate
    # (the timing, then the nudged call after the checks: each the candidate's turn)
    assert events == [("sets", True), ("timed", True), ("after timed", True), ("timed", True), ("after timed", True)]
    assert mapping.writable
    assert "eager" in p.shapes[0].baselines  # timed, outside the block (a read-only baseline would fault)


def test_a_profile_says_where_its_time_went(monkeypatch: pytest.MonkeyPatch) -> None:
    """`phases_s`: the sets, the candidate's timing, each baseline's, the checks (the replay and the
    nudged call are the candidate's calls too), the waits, and the rest as "other": together the
    stage's seconds. A candidate that takes 20 ms a call shows in its own phase and the checks'."""
    import time

    def slow(x, out):
        time.sleep(0.02)
        softmax(x, out)

    p, _ = profile_on_cpu(monkeypatch, slow, Mapping())
    assert isinstance(p, gpu_stages.ProfileResult) and p.ok, p
    phases = p.phases_s
    assert set(phases) == {"settle", "sets", "candidate", "eager", "checks", "calm", "other"}, phases
    assert phases["candidate"] >= 4 * 0.02  # (two sets, each call made twice by the stubbed timing)
    assert phases["checks"] >= 3 * 0.02  # (the last timing replayed over two sets, then the nudged call)
    assert phases["candidate"] > phases["eager"] and phases["checks"] > phases["eager"]
    assert sum(phases.values()) == pytest.approx(p.seconds, abs=0.01)


def test_a_fault_in_the_candidates_timing_is_left_as_the_last_thing_said(monkeypatch: pytest.MonkeyPatch) -> None:
    def faults(x, out):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    mapping = Mapping()
    p, events = profile_on_cpu(monkeypatch, faults, mapping)
    assert events[-1][0] == "timed" and not mapping.writable  # the worker ends; the judge attributes

    def python_error(x, out):
        raise ValueError("a candidate's own error")

    mapping = Mapping()
    p, events = profile_on_cpu(monkeypatch, python_error, mapping)
    assert events[-1] == ("after timed", True) and mapping.writable  # reported, and the baselines go on
    assert isinstance(p, RuntimeError) and "timing failed" in str(p)


def test_a_profile_that_found_the_gpu_shared_leaves_no_ceiling_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its baselines are not cached, and its ceiling is not kept for the next candidate either."""
    monkeypatch.setattr(gpu_stages, "_BANDWIDTH", {"copy": 1.85, "read": 2.6})
    p, _ = profile_on_cpu(monkeypatch, softmax, Mapping(), disturbance="ran at 1.9 TB/s")
    assert isinstance(p, gpu_stages.ProfileResult) and p.ok and p.disturbed == "ran at 1.9 TB/s", p
    assert gpu_stages._BANDWIDTH == {}
    monkeypatch.setattr(gpu_stages, "_BANDWIDTH", {"copy": 4.0, "read": 4.2})
    p, _ = profile_on_cpu(monkeypatch, softmax, Mapping())
    assert isinstance(p, gpu_stages.ProfileResult) and not p.disturbed and gpu_stages._BANDWIDTH["copy"] == 4.0


@pytest.mark.parametrize(
    "here, copies, want, tries",
    [
        ("h200", [4.1], 4.1, 1),  # as alone: measured once
        ("h200", [1.85, 4.0], 4.0, 2),  # a spell beside other work: measured again, the best kept
        ("h200", [1.85, 1.9, 1.8], 1.9, 3),  # a slow card (or a slice of one): accepted after three
        (None, [1.85], 1.85, 1),  # a card we hold no datasheet for: as measured
    ],
)
def test_a_copy_far_below_the_datasheet_is_measured_again(
    monkeypatch: pytest.MonkeyPatch, here: str | None, copies: list[float], want: float, tries: int
) -> None:
    from llmcompile.bench import timing
    from llmcompile.specs.targets import TARGETS

    left = list(copies)
    monkeypatch.setattr(gpu_stages, "_BANDWIDTH", {})
    monkeypatch.setattr(gpu_stages, "target_here", lambda: TARGETS[here] if here else None)
    monkeypatch.setattr(timing, "copy_bandwidths", lambda *a, **k: {"torch bf16": left.pop(0)})
    monkeypatch.setattr(timing, "read_bandwidth", lambda *a, **k: 4.3)
    assert gpu_stages.device_bandwidth(None) == (want, 4.3)
    assert len(copies) - len(left) == tries
