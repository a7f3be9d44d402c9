"""The candidate as the profile times it (`TimedCalls`): output sets rotating against the input
sets, every set checked after the timing, then the nudged call (`Nudge`) right behind the timing's
own graph."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from llmcompile.harness import verify
from llmcompile.harness.guards import Guarded, broken_guard, device_fault, guard_workspace, guarded, sync
from llmcompile.harness.input_sets import InputSets
from llmcompile.specs import OpSpec

NUDGED_ROWS = 8  # rows of the nudged call's input given one moved element each (fewer where it has fewer)
# The moves tried, in turn, until the answer already held (the timed calls', or verification's
# second call's) fails the check on the moved inputs (the check must see a stale answer): +1 is
# within bf16's tolerance of a softmax row of 1024, +16 is not; a min sees only a move down. The
# nudged call on a shape checked whole (rows not independent) tries only the largest, each try a
# float64 reference of the whole set.
NUDGE_MOVES = (1.0, 16.0, 256.0, -1.0, -16.0, -256.0)
NUDGE_MOVES_WHOLE = (256.0, -256.0)


@dataclass
class Nudge:
    """One element in each of a few random rows (the first dimension) of an input set's first
    floating input (`index`), moved by `move` in place only within `moved()`: a cache keyed by a
    sample of the whole input, or of each row, misses them."""

    index: int
    flat: torch.Tensor
    where: torch.Tensor
    old: torch.Tensor
    rows: torch.Tensor  # the rows they lie in
    move: float = 1.0

    @classmethod
    def of(cls, inputs: list[torch.Tensor], rng: random.Random) -> Nudge | None:
        """None: no floating input to move."""
        k, x = next(((k, t) for k, t in enumerate(inputs) if t.is_floating_point() and t.numel()), (0, None))
        if x is None:
            return None
        rows = x.shape[0] if x.dim() else 1
        per = x.numel() // rows
        picked = sorted(rng.sample(range(rows), min(NUDGED_ROWS, rows)))
        where = torch.tensor([r * per + rng.randrange(per) for r in picked], device=x.device)
        flat = x.view(-1)
        return cls(k, flat, where, flat[where].clone(), torch.tensor(picked, device=x.device))

    def write(self, into: torch.Tensor | None = None) -> None:
        """The moved values into `flat` (or `into`, the same bytes at another address), in stream
        order: capturable in a CUDA graph."""
        new = (self.old.double() + self.move).to(self.flat.dtype)
        (self.flat if into is None else into).index_copy_(0, self.where, new)

    def put_back(self) -> None:
        self.flat[self.where] = self.old

    @contextmanager
    def moved(self, written: bool = False) -> Iterator[None]:
        """The elements moved for the block (already, where `written`), put back after it (bit
        for bit: the input sets stay cached for the next candidate); a device fault leaves them,
        as the context is lost."""
        if not written:
            self.write()
        try:
            yield
        except BaseException as e:
            if not device_fault(e):
                self.put_back()
            raise
        self.put_back()


class TimedCalls:
    """The candidate as the benchmark calls it. Each call on input set i writes output set
    (i + calls so far on i) mod k: the output sets rotate against the input sets every round, so
    a call that skips work (all of it, or part, or only when timed back to back) leaves behind an
    answer to another input set. After the timing every output set is checked against the input
    set it was last written from (float64 where memory allows, `verify.check_method`), every
    guard band, and every input's fingerprint; then one more call on a random set with a few
    elements moved is checked (`_nudged_call`)."""

    def __init__(
        self,
        fn: Any,
        spec: OpSpec,
        m: int,
        n: int,
        dtype: str,
        scalars: list,
        sets: InputSets,
        tally: verify.KernelBenchTally | None = None,
    ) -> None:
        self.fn, self.spec, self.m, self.n, self.dtype, self.scalars = fn, spec, m, n, dtype, scalars
        self.sets, self.tally = sets, tally
        self.k = len(sets.guarded)
        self.index = {s[0].view.data_ptr(): i for i, s in enumerate(sets.guarded)}
        device = str(sets.guarded[0][0].view.device)
        self.outputs = [
            [guarded(t.name, t.shape(m, n), t.torch_dtype(dtype), device) for t in spec.outputs] for _ in range(self.k)
        ]
        for o in self.outputs:
            verify.poison([g_.view for g_ in o])
        self.workspace = guard_workspace(fn, sets.guarded[0][0].view.device)
        self.turns = [0] * self.k
        self.last: list[int | None] = [None] * self.k  # output set o was last written from input set last[o]
        self.failure: str | None = None
        self.check_kind = "timed_output"
        self.method = ""
        self.make_room: Callable[[], None] = lambda: None  # frees what the float64 check may need
        # the candidate's turn at the GPU (inputs read-only, its start and end told: `gpu_stages._candidates_turn`)
        self.turn: Callable[[], AbstractContextManager[None]] = nullcontext
        self.nudge_note = ""  # what the nudged call moved (or why there was none), for the checks' list

    def __call__(self, *ins: torch.Tensor) -> None:
        self._call(self.index[ins[0].data_ptr()], ins)

    def _call(self, i: int, ins: tuple[torch.Tensor, ...] | list[torch.Tensor], o: int | None = None) -> None:
        """The call on input set i (`ins`), into output set `o` (None: its turn in the rotation)."""
        if o is None:
            o = (i + self.turns[i]) % self.k
            self.turns[i] += 1
        self.last[o] = i
        self.fn(*ins, *(g_.view for g_ in self.outputs[o]), *self.scalars)

    def _nudged_call(self, sets: list[list[torch.Tensor]], replay: Callable[[], None] | None = None) -> str | None:
        """One more call, on a random input set with a few elements moved (`Nudge`), its workspace as
        the timing left it, and its output checked: verification poisons the workspace before each
        call, so a kernel keeping its answers there, keyed by the input's address or a sample of it,
        could serve them to the timed calls alone; here it serves the old values' answer. One that
        serves them only to calls that follow closely (it can read the GPU's clock) meets the
        call as it met the timed ones: the timing's own graph again (`replay`), then at once a
        round of calls with the move written meanwhile and the nudged call last (`_tail`). The move
        is one the check sees: the set's answer from the timed calls (checked) must fail it on the
        moved inputs. Made after the timed outputs are checked: it overwrites them."""
        rng = random.SystemRandom()  # (drawn here, each time: nothing a kernel could know)
        i = rng.randrange(self.k)
        held = next((o for o in range(self.k) if self.last[o] == i), None)  # set i's timed answer
        nudge = Nudge.of(sets[i], rng)
        if held is None or nudge is None:
            self.nudge_note = "; no nudged call (no floating input)" if nudge is None else ""
            return None
        rows = nudge.rows if self._by_rows(nudge) else None
        for move in NUDGE_MOVES if rows is not None else NUDGE_MOVES_WHOLE:
            nudge.move = move
            with nudge.moved():
                check = self._checker(sets[i], rows)
                if check(self.outputs[held]) is not None:
                    break
        else:
            self.nudge_note = "; no nudged call (no move of a few elements changes the answer beyond the bound)"
            return None
        self.nudge_note = f"; nudged call: {nudge.where.numel()} elements moved by {nudge.move:+g}, " + (
            "the timing replayed, then a round" if replay is not None else "after a round"
        )
        with self.sets.writable_alias() as alias:  # (outside the candidate's try: its failure is the judge's)
            write = functools.partial(nudge.write, alias(nudge.flat))
            try:
                with self.turn():
                    tail = self._tail(sets, i, held, write)
                    if replay is not None:
                        replay()
                    tail()
            except Exception as e:
                if device_fault(e):
                    raise
                nudge.put_back()
                self.check_kind = "error"
                return f"the call after the timed ones raised {type(e).__name__}: {str(e)[:300]}"
        with nudge.moved(written=True):
            if (name := broken_guard(self.outputs[held] + self.workspace)) is not None:
                self.check_kind = "out_of_bounds_write"
                return f"the nudged call wrote outside {'its scratch workspace' if name == 'workspace' else f'the output `{name}`'}"
            bad = check(self.outputs[held])
        # (the round's calls had the inputs read-only, but a second, writable mapping existed meanwhile)
        if bad is None and (why := self.sets.tampered()) is not None:
            self.check_kind = "input_modified" if "changed during" in why else "out_of_bounds_write"
            return f"after the nudged call: {why}"
        if bad is None:
            return None
        self.check_kind = "stale"
        return (
            f"a call right after the timed ones, its workspace as they left it, on input set {i} of {self.k} with "
            f"{nudge.where.numel()} elements moved by {nudge.move:+g} in place (an answer kept from the timed "
            f"calls?): {bad.describe()}"
        )

    def _tail(
        self, sets: list[list[torch.Tensor]], i: int, o: int, write_nudge: Callable[[], None]
    ) -> Callable[[], None]:
        """The nudged call, made as the timed calls are: a round of calls, set i's first (into
        output set o) and the others' into the other output sets; once set i's is done, the move
        written and o poisoned on a side stream while the others run; then set i's call into o.
        The gap before that call is the timed calls' own, but for one set (the move alone is made
        between two calls on it). A CUDA graph where the GPU captures one: launched right after the
        timing's own graph, its calls follow the timed ones as those followed each other."""
        order = [i] + [j for j in range(self.k) if j != i]
        slots = [o] + [q for q in range(self.k) if q != o]
        # With one set nothing runs beside the poison: it would stand between the two calls on the
        # set, a pass over the whole output (large: two sets of the shape did not fit).
        # Unpoisoned, o holds the round's first call's answer to the unmoved inputs, which fails
        # the check by the move's choice, so a nudged call that skips its work still shows.
        outs = [g_.view for g_ in self.outputs[o]] if self.k > 1 else []

        def body(side: torch.cuda.Stream | None) -> None:
            self._call(i, sets[i], o)
            main = torch.cuda.current_stream() if side is not None else None
            if side is not None:
                side.wait_stream(main)
            with torch.cuda.stream(side) if side is not None else nullcontext():
                write_nudge()
                verify.poison(outs)
            for j, q in zip(order[1:], slots[1:]):
                self._call(j, sets[j], q)
            if side is not None:
                main.wait_stream(side)
            self._call(i, sets[i], o)

        if sets[i][0].device.type != "cuda":
            self.nudge_note += ", eagerly"
            return functools.partial(body, None)
        side = torch.cuda.Stream()
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g):
                body(side)
        except Exception:  # noqa: BLE001 - as the timing: a candidate that cannot be captured is called eagerly
            sync()
            self.nudge_note += ", eagerly"
            return functools.partial(body, side)
        self.nudge_note += ", in a graph"
        return g.replay

    def _by_rows(self, nudge: Nudge) -> bool:
        """Whether the nudged rows can be checked alone: rows independent, and the nudged input's
        first dimension is theirs."""
        return verify.rows_independent(self.spec) and self.spec.inputs[nudge.index].dims[:1] == ("M",)

    def _checker(
        self, ins: list[torch.Tensor], rows: torch.Tensor | None
    ) -> Callable[[list[Guarded]], verify.Mismatch | None]:
        """What checks an output set as the answer to `ins` as they now stand: on `rows` alone, or
        whole. The float64 reference is made once (it serves the held answer and the new one)
        except where the whole shape's does not fit (`verify.check_method`)."""

        def views(outs: list[Guarded]) -> list[torch.Tensor]:
            return [g_.view for g_ in outs]

        def pick(ts: list[torch.Tensor], descs: tuple) -> list[torch.Tensor]:
            return [t[rows] if d.dims[:1] == ("M",) else t for t, d in zip(ts, descs)]

        if rows is not None:
            ref = verify.Reference(self.spec, self.dtype, pick(ins, self.spec.inputs))
            return lambda outs: ref.check(pick(views(outs), self.spec.outputs))
        if verify.check_method(self.spec, ins, views(self.outputs[0])) == "float64":
            whole = verify.Reference(self.spec, self.dtype, ins)
            return lambda outs: whole.check(views(outs))
        return lambda outs: verify.compare_rows(self.spec, self.dtype, ins, views(outs))

    def check(self, sets: list[list[torch.Tensor]], replay: Callable[[], None] | None = None) -> str | None:
        """What is wrong with what the timed calls did (None: nothing). `replay`: the timing's
        calls made again as timed (its graph), for the nudged call to follow."""
        sync()
        self.failure = self._check(sets, replay)
        return self.failure

    def _check(self, sets: list[list[torch.Tensor]], replay: Callable[[], None] | None) -> str | None:
        if (why := self.sets.tampered()) is not None:
            self.check_kind = "input_modified" if "changed during" in why else "out_of_bounds_write"
            return why
        for o, outs in enumerate(self.outputs):
            if (name := broken_guard(outs)) is not None:
                self.check_kind = "out_of_bounds_write"
                return f"the timed calls wrote outside the output `{name}` (output set {o})"
        if broken_guard(self.workspace) is not None:
            self.check_kind = "out_of_bounds_write"
            return "the timed calls wrote outside their scratch workspace"
        methods = set()
        for o, outs in enumerate(self.outputs):
            i = self.last[o]
            if i is None:
                return f"the timed calls never wrote output set {o}"
            views = [g_.view for g_ in outs]
            if verify.check_method(self.spec, sets[i], views) == "torch's own output":
                self.make_room()
            methods.add(verify.check_method(self.spec, sets[i], views))
            bad = verify.compare_rows(self.spec, self.dtype, sets[i], views, tally=self.tally)
            if bad is not None:
                return f"output set {o}, last written from input set {i} of {self.k}: {bad.describe()}"
        self.method = ", ".join(sorted(methods))
        return self._nudged_call(sets, replay)

    def release(self) -> None:
        self.outputs, self.workspace = [], []
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
