"""CPU (CI): the verify and timed-output checks themselves, with Python stand-ins for kernels.

`gpu_stages` runs on any device: here the "kernels" are torch functions that cheat in the ways a
candidate can (write past an input, cache by pointer or by a sample of the input, keep state in
the workspace, hard-code a scalar, skip a row, skip work on a repeat), each beside its honest
twin. Read-only inputs need the GPU's virtual memory: tests/test_harness_gpu.py covers them."""

from __future__ import annotations

import random
from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch

from llmcompile.harness import gpu_stages
from llmcompile.specs import OpSpec, TensorDesc, Tolerance, get_op
from llmcompile.specs.contract import WithWorkspace

SOFTMAX = get_op("softmax")
RMSNORM = get_op("rmsnorm")
SHAPES = [(1, 64), (3, 64), (37, 64), (5, 200), (41, 200)]


def _past_end(t: torch.Tensor, k: int = 0) -> torch.Tensor:
    """The element k places past the end of `t`'s view (in its storage): what a kernel that
    indexes one too far touches."""
    return torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), t.storage_offset() + t.numel() + k, (1,))


def softmax(x: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(torch.softmax(x.double(), -1).to(out.dtype))


def rmsnorm(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, eps: float) -> None:
    xd = x.double()
    out.copy_((xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * w.double()).to(out.dtype))


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
        _past_end(w).fill_(1.0)

    v = _verify(stash, RMSNORM)
    assert _failed(v) == "out_of_bounds_write" and "input `weight`" in v.failure.detail


def test_a_write_past_the_end_of_an_output_names_it() -> None:
    def spill(x, out):
        softmax(x, out)
        _past_end(out).fill_(0.0)

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
            _past_end(ws).fill_(float(x.sum()))
        softmax(x, out)

    return WithWorkspace(kernel, 2, 8)


def test_a_write_past_the_scratch_workspace_is_caught_when_verified_and_when_timed() -> None:
    assert _verify(_with_workspace(False)).ok
    v = _verify(_with_workspace(True))
    assert _failed(v) == "out_of_bounds_write" and "scratch `workspace`" in v.failure.detail, v.failure
    for past in (False, True):
        sets = gpu_stages.make_sets(SOFTMAX, 64, 256, "float32", count=2, device="cpu")
        timed = _timed(_with_workspace(past), sets)
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


def _timed(fn: Callable, sets: gpu_stages.InputSets, rounds: int = 3) -> gpu_stages.TimedCalls:
    """The calls as the benchmark makes them: warm-ups, then rounds of one call per input set."""
    timed = gpu_stages.TimedCalls(fn, SOFTMAX, 64, 256, "float32", [], sets)
    for _ in range(rounds):
        for s in sets.views:
            timed(*s)
    return timed


def test_timed_outputs_rotate_so_a_skipped_repeat_leaves_another_sets_answer() -> None:
    sets = gpu_stages.make_sets(SOFTMAX, 64, 256, "float32", count=3, device="cpu")
    assert _timed(softmax, sets).check(sets.views) is None
    calls = [0]

    def skips_repeats(x, out):  # right on the first calls, then half the work
        calls[0] += 1
        softmax(x, out) if calls[0] <= 3 else softmax(x[:32], out[:32])

    bad = _timed(skips_repeats, sets).check(sets.views)
    assert bad is not None and "last written from input set" in bad, bad


def test_timed_calls_that_change_an_input_or_write_past_it_are_caught() -> None:
    sets = gpu_stages.make_sets(SOFTMAX, 64, 256, "float32", count=2, device="cpu")

    def marks(x, out):
        softmax(x, out)
        x[0, 0] = x[0, 0] + 1e-3  # a tiny mark, within any tolerance of the answer

    timed = _timed(marks, sets)
    assert "changed during the timed calls" in (timed.check(sets.views) or "")
    assert timed.check_kind == "input_modified"
    sets = gpu_stages.make_sets(SOFTMAX, 64, 256, "float32", count=2, device="cpu")

    def past(x, out):
        softmax(x, out)
        _past_end(x).fill_(0.0)

    timed = _timed(past, sets)
    assert "guard band of input `x`" in (timed.check(sets.views) or "")
    assert timed.check_kind == "out_of_bounds_write"


def test_fingerprints_see_a_swap() -> None:
    x = torch.randn(1000)
    y = x.clone()
    y[[3, 700]] = y[[700, 3]]
    assert gpu_stages.fingerprint(x) != gpu_stages.fingerprint(y)
    assert gpu_stages.fingerprint(x) == gpu_stages.fingerprint(x.clone())


def test_every_timed_input_set_is_checked_not_only_the_first_and_last() -> None:
    """A kernel that skips work on the input sets between the first and the last (a judge that
    checks two sets of many sees nothing)."""
    sets = gpu_stages.make_sets(SOFTMAX, 64, 256, "float32", count=4, device="cpu")
    middle = {sets.views[1][0].data_ptr(), sets.views[2][0].data_ptr()}

    def skips_middle(x, out):
        softmax(x[:32], out[:32]) if x.data_ptr() in middle else softmax(x, out)

    bad = _timed(skips_middle, sets).check(sets.views)
    assert bad is not None and "last written from input set" in bad, bad


def test_a_write_into_another_input_set_during_the_timed_calls_is_caught() -> None:
    sets = gpu_stages.make_sets(SOFTMAX, 64, 256, "float32", count=2, device="cpu")
    other = sets.views[1][0]

    def writes_elsewhere(x, out):
        softmax(x, out)
        if x.data_ptr() != other.data_ptr():
            other[5, 5] = 0.0  # into the set the next call reads

    timed = _timed(writes_elsewhere, sets)
    assert "input `x` (set 1) changed during the timed calls" in (timed.check(sets.views) or "")


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


def test_the_number_of_timed_replays_is_not_known_in_advance() -> None:
    """A kernel counting its calls cannot tell which replay is the last, whose outputs are checked."""
    from llmcompile.bench import timing

    draws = {timing.replays(20) for _ in range(200)}
    assert min(draws) >= 20 and max(draws) < 20 + timing.REPS_SPREAD and len(draws) > 3


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


def test_the_nudge_moves_a_few_elements_of_the_first_floating_input_only() -> None:
    idx = torch.arange(6).reshape(2, 3)
    x = torch.randn(64, 1024)
    copy = gpu_stages.judge_copy([idx, x], on_device=False)
    copy.nudge(7)
    moved = copy.tensors[1] != x
    assert 1 <= int(moved.sum()) <= 64 and torch.equal(copy.tensors[0], idx)
    assert torch.equal(copy.tensors[1][moved], x[moved] + 1)
    other = gpu_stages.judge_copy([x], on_device=False)
    other.nudge(8)
    assert not torch.equal(other.tensors[0] != x, moved)  # a case's own draw


@pytest.mark.gpu
def test_the_judges_device_copy_is_read_only_between_its_loads() -> None:
    x = torch.randn(3, 1000, 333, device="cuda").to(torch.bfloat16)
    copy = gpu_stages.judge_copy([x], on_device=True)
    try:
        (t,) = copy.tensors
        assert copy.mappings[0].writable is False and t.shape == x.shape and t.dtype == x.dtype
        assert torch.equal(t.view(torch.uint8), x.view(torch.uint8))
        copy.nudge(3)
        moved = int((t != x).sum())
        assert 1 <= moved <= x.numel() // 1024 and copy.mappings[0].writable is False
        y = torch.randn_like(x)
        copy.load([y])
        assert torch.equal(t, y) and copy.mappings[0].writable is False
    finally:
        copy.release()


# Each way a candidate could write into the judge's device copy during its call: a kernel (a torch
# fill stands in), or its host code through the CUDA runtime (the sealed module may call CuTe DSL's
# runtime entries, which include memset and memcpy). Run in a child: a fault breaks the context.
_WRITES = {
    "a kernel": "t.fill_(0.0)",
    "the runtime's memset": "print('rc', rt.cudaMemset(t.data_ptr(), 0, 4096)[0])",
    "the runtime's copy": "print('rc', rt.cudaMemcpy(t.data_ptr(), z.data_ptr(), 4096, rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice)[0])",
}


@pytest.mark.gpu
@pytest.mark.parametrize("how", list(_WRITES))
def test_the_judges_device_copy_cannot_be_written_by_a_candidate(how: str) -> None:
    import subprocess
    import sys

    script = f"""
import torch
from cuda.bindings import runtime as rt
from llmcompile.harness import gpu_stages
x = torch.randn(1 << 20, device="cuda")
z = torch.zeros_like(x)
copy = gpu_stages.judge_copy([x], on_device=True)
(t,) = copy.tensors
print("attempted", flush=True)
{_WRITES[how]}
torch.cuda.synchronize()
print("unchanged" if torch.equal(t, x) else "CHANGED")
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    said = r.stdout + r.stderr
    assert "attempted" in r.stdout and "CHANGED" not in r.stdout, said
    # refused (an error code, then the copy unchanged) or faulted (the context broken)
    assert "unchanged" in r.stdout or (r.returncode != 0 and "CUDA" in r.stderr), said
    print(how, "->", r.stdout.split("attempted")[1].strip().replace("\n", " ") or r.stderr.strip()[-160:])


@pytest.mark.gpu
def test_the_profiles_input_sets_share_one_mapping_read_only_while_timed() -> None:
    sets = gpu_stages.make_sets(RMSNORM, 4096, 1024, "bfloat16", count=5)
    try:
        assert sets.mapping is not None and sets.mapping.writable
        lo, hi = sets.mapping.ptr, sets.mapping.ptr + sets.mapping.size
        ptrs = [g_.buf.data_ptr() for s in sets.guarded for g_ in s]
        assert len(ptrs) == 10 and all(lo <= p < hi for p in ptrs) and len(set(ptrs)) == 10
        assert all(g_.view.data_ptr() % 16 == 0 and g_.guards_intact() for s in sets.guarded for g_ in s)
        assert sets.tampered() is None
        with sets.read_only():
            assert not sets.mapping.writable
            out = torch.empty_like(sets.views[0][0])
            out.copy_(sets.views[3][0])  # reading is as ever
        assert sets.mapping.writable and torch.equal(out, sets.views[3][0])
        # the judge's writes in stream order while the candidate's view stays read-only: a second address
        x = sets.views[1][0]
        with sets.read_only(), sets.writable_alias() as alias:
            w = alias(x)
            assert w.data_ptr() != x.data_ptr() and not sets.mapping.writable
            w[5, 7] = 3.0
            seen = float(x[5, 7])  # (through the read-only address, in stream order)
        assert seen == 3.0 and float(x[5, 7]) == 3.0 and sets.guarded[1][0].guards_intact()
        assert sets.tampered() is not None  # (the judge's write is seen as any other)
    finally:
        sets.release()
    assert sets.mapping is None


@pytest.mark.gpu
def test_a_write_into_the_profiles_inputs_while_timed_faults_even_when_put_back() -> None:
    import subprocess
    import sys

    script = """
import torch
from llmcompile.harness import gpu_stages
from llmcompile.specs import get_op
sets = gpu_stages.make_sets(get_op("softmax"), 4096, 1024, "bfloat16", count=3)
x = sets.views[2][0]
keep = x.clone()
with sets.read_only():
    print("attempted", flush=True)
    x.fill_(0.0)
    x.copy_(keep)
    torch.cuda.synchronize()
print("unchanged" if sets.tampered() is None else "CHANGED")
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    said = r.stdout + r.stderr
    assert "attempted" in r.stdout and "unchanged" not in r.stdout and "CHANGED" not in r.stdout, said
    assert r.returncode != 0 and gpu_stages.device_fault(RuntimeError(r.stderr[-2000:])), said


@pytest.mark.gpu
def test_inputs_in_a_mapping_read_as_fast_as_torchs_memory() -> None:
    """The profile's inputs moved from torch's allocator into a VMM mapping: the same bandwidth,
    or every timing of the judge would shift (a copy of 1 GiB, medians, alternating)."""
    from llmcompile.bench import timing
    from llmcompile.harness import readonly

    nbytes = 1 << 30
    m = readonly.allocate(nbytes)
    try:
        mapped = m.tensor(nbytes).view(torch.bfloat16)
        mapped.normal_()
        plain = torch.randn(nbytes // 2, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(plain)
        rates: dict[str, list[float]] = {"mapping": [], "torch": []}
        for _ in range(3):
            for name, src in (("mapping", mapped), ("torch", plain)):
                t = timing.time_calls([lambda src=src: dst.copy_(src)], graph=False)
                rates[name].append(2 * nbytes / t.median_ms / 1e9)
        mine, theirs = sorted(rates["mapping"])[1], sorted(rates["torch"])[1]
        print(f"copy from a mapping {mine:.3f} TB/s, from torch's memory {theirs:.3f} TB/s")
        assert mine >= 0.97 * theirs, rates
    finally:
        torch.cuda.synchronize()
        m.free()


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


class _Mapping:
    """A stand-in for a read-only-capable mapping: records the access changes and the free."""

    def __init__(self) -> None:
        self.writable, self.changes, self.freed = True, [], False

    def set_writable(self, writable: bool) -> None:
        self.writable = writable
        self.changes.append(writable)

    def free(self) -> None:
        self.freed = True

    def alias(self) -> SimpleNamespace:
        """The judge's writable view of the inputs: on the CPU, the tensors themselves."""
        self.aliases = getattr(self, "aliases", 0) + 1
        return SimpleNamespace(view_of=lambda t: t, free=lambda: None)


def test_the_inputs_are_read_only_only_while_the_candidate_is_timed() -> None:
    sets = gpu_stages.make_sets(SOFTMAX, 64, 256, "float32", count=2, device="cpu")
    assert sets.mapping is None  # (the CPU has none: the block runs as it is)
    sets.mapping = mapping = _Mapping()
    with sets.read_only():
        assert not mapping.writable
    assert mapping.writable and mapping.changes == [False, True]
    with pytest.raises(ValueError), sets.read_only():  # the candidate's Python error: writable again
        raise ValueError("a candidate's error")
    assert mapping.writable
    with pytest.raises(RuntimeError), sets.read_only():  # a fault: left to the worker's end
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    assert not mapping.writable


def test_dropped_input_sets_free_their_mapping(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another problem's sets, a tampered set, a shape dropped for room: each frees its mapping."""
    made: list[gpu_stages.InputSets] = []
    real = gpu_stages.make_sets

    def make(spec: OpSpec, m: int, n: int, dtype: str, count: int | None = None) -> gpu_stages.InputSets:
        made.append(real(spec, m, n, dtype, count=2, device="cpu"))
        made[-1].mapping = _Mapping()
        return made[-1]

    free = [1 << 40]
    monkeypatch.setattr(gpu_stages, "make_sets", make)
    monkeypatch.setattr(gpu_stages, "_free", lambda: free[0])
    monkeypatch.setattr(gpu_stages, "_SETS", {})
    a = gpu_stages.cached_sets(SOFTMAX, 64, 256, "float32")
    b = gpu_stages.cached_sets(SOFTMAX, 64, 512, "float32")
    assert gpu_stages.cached_sets(SOFTMAX, 64, 256, "float32") is a and not a.mapping.freed
    mappings = [a.mapping, b.mapping]
    c = gpu_stages.cached_sets(RMSNORM, 64, 256, "float32")  # another problem's: both dropped
    assert all(m.freed for m in mappings) and a.mapping is None and b.mapping is None
    c.guarded[1][0].view[0, 0] += 1.0  # tampered: made again, the old mapping freed
    first = c.mapping
    c2 = gpu_stages.cached_sets(RMSNORM, 64, 256, "float32")
    assert c2 is not c and first.freed and not c2.mapping.freed
    free[0] = 0  # no room: the older shape goes first
    second = c2.mapping
    d = gpu_stages.cached_sets(RMSNORM, 64, 512, "float32", need=(1, 1))
    assert second.freed and not d.mapping.freed
    last = d.mapping
    gpu_stages.forget_sets()
    assert last.freed and gpu_stages._SETS == {}


def test_sets_laid_in_one_slab_keep_their_guard_bands_apart() -> None:
    shape, dtype = (3, 100), torch.bfloat16
    size = gpu_stages.slab_bytes(shape, dtype)
    assert size % 512 == 0 and size >= 2 * gpu_stages.GUARD_BYTES + 600
    slab = torch.zeros(2 * size, dtype=torch.uint8)
    a = gpu_stages.guarded("x", shape, dtype, "cpu", within=slab[:size])
    b = gpu_stages.guarded("x", shape, dtype, "cpu", within=slab[size:])
    a.view.fill_(1.0)
    b.view.fill_(2.0)
    assert a.guards_intact() and b.guards_intact()
    assert b.view.data_ptr() - a.view.data_ptr() == size and a.view.data_ptr() % 16 == 0
    _past_end(a.view).fill_(0.0)
    assert not a.guards_intact() and b.guards_intact()


def _profile_on_cpu(
    monkeypatch: pytest.MonkeyPatch,
    candidate: Callable,
    mapping: _Mapping,
    sets: gpu_stages.InputSets | None = None,
    dtype: str = "float32",
    disturbance: str | None = None,
) -> tuple[object, list]:
    """`profile_candidate` whole on the CPU, its timing stubbed (each call made twice), on sets
    whose mapping is the stand-in `mapping`: (its result or the exception it raised, the progress
    events with the mapping's access at each)."""
    from llmcompile.bench import timing

    sets = sets or gpu_stages.make_sets(SOFTMAX, 64, 256, "float32", count=2, device="cpu")
    sets.mapping = mapping
    monkeypatch.setattr(gpu_stages, "cached_sets", lambda *a, **k: sets)
    for name in ("settle", "wait_calm"):
        monkeypatch.setattr(timing, name, lambda *a, **k: None)
    monkeypatch.setattr(timing, "disturbance", lambda *a, **k: disturbance)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    def time_calls(calls, graph=True, keep=False):
        def run() -> None:
            for c in calls:
                c()

        run()  # (a warm-up, then the timed run)
        run()
        return timing.Timing(1.0, 1.0, 1, graph, replay=run if keep else None)

    monkeypatch.setattr(timing, "time_calls", time_calls)
    events: list = []
    try:
        out: object = gpu_stages.profile_candidate(
            {sets.views[0][0].shape[1]: candidate}, SOFTMAX, dtype, [tuple(sets.views[0][0].shape)], (3.0, 3.0), ["eager"],
            progress=lambda m, n, what: events.append((what, mapping.writable)),
        )  # fmt: skip
    except Exception as e:  # noqa: BLE001 - what the worker would see
        out = e
    return out, events


def test_the_profile_times_only_the_candidate_with_read_only_inputs_and_says_when(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mapping = _Mapping()
    writable_when_called: list[bool] = []

    def candidate(x, out):
        writable_when_called.append(mapping.writable)
        softmax(x, out)

    p, events = _profile_on_cpu(monkeypatch, candidate, mapping)
    assert isinstance(p, gpu_stages.ProfileResult) and p.ok and p.read_only, p
    assert writable_when_called and not any(writable_when_called)  # every call of the candidate
    # (the timing, then the nudged call after the checks: each the candidate's turn)
    assert events == [("sets", True), ("timed", True), ("after timed", True), ("timed", True), ("after timed", True)]
    assert mapping.writable
    assert "eager" in p.shapes[0].baselines  # timed, outside the block (a read-only baseline would fault)


def test_a_fault_in_the_candidates_timing_is_left_as_the_last_thing_said(monkeypatch: pytest.MonkeyPatch) -> None:
    def faults(x, out):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    mapping = _Mapping()
    p, events = _profile_on_cpu(monkeypatch, faults, mapping)
    assert events[-1][0] == "timed" and not mapping.writable  # the worker ends; the judge attributes

    def python_error(x, out):
        raise ValueError("a candidate's own error")

    mapping = _Mapping()
    p, events = _profile_on_cpu(monkeypatch, python_error, mapping)
    assert events[-1] == ("after timed", True) and mapping.writable  # reported, and the baselines go on
    assert isinstance(p, RuntimeError) and "timing failed" in str(p)


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
    monkeypatch.setattr(gpu_stages.random, "SystemRandom", lambda: random.Random(7))  # (the nudge's rows: fixed)
    sets = gpu_stages.make_sets(SOFTMAX, 64, n, dtype, count=2, device="cpu")
    p, _ = _profile_on_cpu(monkeypatch, _keeps_answers(per_row), _Mapping(), sets, dtype)
    assert isinstance(p, gpu_stages.ProfileResult) and not p.ok and p.failure is not None, p
    assert p.failure.check == "stale" and "after the timed ones" in p.failure.detail, p.failure
    assert f"moved by {move} in place" in p.failure.detail, p.failure.detail
    assert sets.tampered() is None  # the nudge put back: the sets stay cached for the next candidate


def test_answers_served_only_to_calls_in_quick_succession_are_stale_on_the_nudged_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A kernel that keeps its answers and serves them only where its last call was moments ago
    (on a GPU it would read the clock): the judge's float64 checks between the timing and the
    nudged call stand for seconds here, each a tick of the kernel's clock. The timing's own work
    replayed, then a round, then the nudged call, meet it with no tick between."""
    ticks = [0]

    def ticking(check: Callable) -> Callable:
        def checked(*a: object, **k: object) -> object:
            ticks[0] += 1
            return check(*a, **k)

        return checked

    monkeypatch.setattr(gpu_stages.verify, "compare_rows", ticking(gpu_stages.verify.compare_rows))
    monkeypatch.setattr(gpu_stages.verify.Reference, "check", ticking(gpu_stages.verify.Reference.check))
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

    monkeypatch.setattr(gpu_stages.random, "SystemRandom", lambda: random.Random(7))
    p, _ = _profile_on_cpu(monkeypatch, in_quick_succession, _Mapping())
    assert served[0] > 0  # (its answers served while timed: right there, the inputs unchanged)
    assert isinstance(p, gpu_stages.ProfileResult) and p.failure is not None, p
    assert p.failure.check == "stale" and "right after the timed ones" in p.failure.detail, p.failure


def test_an_input_changed_during_the_nudged_calls_round_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The round's calls see read-only inputs, but a second, writable mapping of them exists then
    (the judge's, for the move): the sets are fingerprinted again after it."""
    calls = [0]

    def marks_late(x: torch.Tensor, out: torch.Tensor) -> None:
        calls[0] += 1
        softmax(x, out)
        if calls[0] == 8:  # (the timing's 2 x 2 calls, its replay's 2, then the round's second call)
            x[0, 0] += 1e-3

    p, _ = _profile_on_cpu(monkeypatch, marks_late, _Mapping())
    assert isinstance(p, gpu_stages.ProfileResult) and p.failure is not None, p
    assert p.failure.check == "input_modified" and "after the nudged call" in p.failure.detail, p.failure


def test_an_honest_kernel_passes_the_nudged_call_and_the_sets_are_put_back(monkeypatch: pytest.MonkeyPatch) -> None:
    sets = gpu_stages.make_sets(SOFTMAX, 64, 256, "float32", count=2, device="cpu")
    before = [t.clone() for s in sets.views for t in s]
    as_made = {s[0].data_ptr(): s[0].clone() for s in sets.views}
    calls: list[tuple[int, bool]] = []

    def honest(x, out):
        calls.append((x.data_ptr(), torch.equal(x, as_made[x.data_ptr()])))
        softmax(x, out)

    p, _ = _profile_on_cpu(monkeypatch, honest, _Mapping(), sets)
    assert isinstance(p, gpu_stages.ProfileResult) and p.ok, p
    assert "nudged call: 8 elements moved by +1, the timing replayed, then a round, eagerly" in p.checks[0], p.checks
    assert all(torch.equal(t, b) for t, b in zip((t for s in sets.views for t in s), before))
    # the timing's two calls a set, its replay, then a round (the nudged set first) and the nudged call
    assert len(calls) == 9, calls
    (first, as_made_1), (other, as_made_2), (last, moved_away) = calls[-3:]
    assert as_made_1 and as_made_2 and not moved_away  # (the move between the two calls on the set)
    assert first == last != other


def test_a_nudge_moves_one_element_a_row_and_is_put_back_unless_the_context_is_lost() -> None:
    x = torch.randn(5, 7, dtype=torch.bfloat16)
    before = x.clone()
    nudge = gpu_stages.Nudge.of([torch.zeros(3, dtype=torch.int64), x], random.Random(1))
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
    assert gpu_stages.Nudge.of([torch.zeros(3, dtype=torch.int64)], random.Random(0)) is None
    many = gpu_stages.Nudge.of([torch.randn(100, 3)], random.Random(2))
    assert many is not None and len({int(w) // 3 for w in many.where}) == gpu_stages.NUDGED_ROWS


def test_a_kernel_wrong_on_every_call_is_told_wrong_not_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    def skips_half(x, out):
        softmax(x[:32], out[:32])

    checks = set()
    for seed in range(4):  # (the nudged call on either set, so its output set is checked first or last)
        monkeypatch.setattr(gpu_stages.random, "SystemRandom", lambda seed=seed: random.Random(seed))
        p, _ = _profile_on_cpu(monkeypatch, skips_half, _Mapping())
        assert isinstance(p, gpu_stages.ProfileResult) and p.failure is not None, p
        checks.add(p.failure.check)
    assert checks == {"timed_output"}


def test_a_profile_that_found_the_gpu_shared_leaves_no_ceiling_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its baselines are not cached, and its ceiling is not kept for the next candidate either."""
    monkeypatch.setattr(gpu_stages, "_BANDWIDTH", {"copy": 1.85, "read": 2.6})
    p, _ = _profile_on_cpu(monkeypatch, softmax, _Mapping(), disturbance="ran at 1.9 TB/s")
    assert isinstance(p, gpu_stages.ProfileResult) and p.ok and p.disturbed == "ran at 1.9 TB/s", p
    assert gpu_stages._BANDWIDTH == {}
    monkeypatch.setattr(gpu_stages, "_BANDWIDTH", {"copy": 4.0, "read": 4.2})
    p, _ = _profile_on_cpu(monkeypatch, softmax, _Mapping())
    assert isinstance(p, gpu_stages.ProfileResult) and not p.disturbed and gpu_stages._BANDWIDTH["copy"] == 4.0


def test_a_whole_shape_op_is_nudged_and_checked_whole() -> None:
    """Rows not independent (a loss's sum over the rows): the nudged call tries the largest moves
    only, each checked against the whole shape's float64 reference."""
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
        sets = gpu_stages.make_sets(spec, 16, 64, "float32", count=2, device="cpu")
        timed = gpu_stages.TimedCalls(fn, spec, 16, 64, "float32", scalars, sets)
        for _ in range(2):
            for s in sets.views:
                timed(*s)
        why = timed.check(sets.views)
        assert (timed.check_kind if why else None) == want, why
        assert "moved by +256" in timed.nudge_note or "moved by -256" in timed.nudge_note, timed.nudge_note
        assert sets.tampered() is None


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
