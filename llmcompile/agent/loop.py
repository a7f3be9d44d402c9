"""The agent loop, in one place: prompt -> k candidates -> judge -> feedback -> ... -> best.

conversations[s] = [system, task]                    (prompts/, jinja2)
each round r:
    answers   = provider.propose(conversations)      (openai | offline | replay)
    sources   = code block of each answer
    verdicts  = judge.evaluate_many(sources)         (static, compile, verify, profile)
    best      = the verified candidate whose slowest shape is fastest
    conversations[s] += [answer, feedback(verdict, best)]
stop when the best reaches the target % of SOL on every shape, or a budget runs out,
or on Ctrl-C. Every step is written to the run directory first (llmcompile.agent.runs), so
--resume continues where it stopped and a judged source is never judged twice.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llmcompile.agent import prompting
from llmcompile.agent.providers import Answer, Message, Provider, Slot, Usage
from llmcompile.agent.runs import RunConfig, RunStore
from llmcompile.harness import Judge, JudgeOptions, verdict_key
from llmcompile.harness.verdict import STATIC_REJECTED, Verdict
from llmcompile.specs import OpSpec
from llmcompile.specs.targets import get_target

HISTORY_EXCHANGES = 3  # answer/feedback pairs kept per conversation, after system + task


@dataclass
class Best:
    id: str
    min_pct: float
    mean_pct: float
    source: str
    verdict: Verdict
    note: str = ""


@dataclass
class RunResult:
    stop_reason: str
    rounds: int
    judged: int
    verdicts: dict[str, int]
    usage: Usage
    wall_s: float
    best: Best | None = None
    first_hit: dict[str, Any] = field(default_factory=dict)  # when the target was first reached


def _score(v: Verdict, compile_only: bool) -> tuple[float, float] | None:
    if not v.passed:
        return None
    if v.profile and v.profile.shapes:
        pcts = [s.pct_sol for s in v.profile.shapes]
        return min(pcts), sum(pcts) / len(pcts)
    return (0.0, 0.0) if compile_only or v.verify else None


def _trim(conv: list[Message]) -> list[Message]:
    return conv[:2] + conv[2:][-2 * HISTORY_EXCHANGES :]


def run_agent(
    spec: OpSpec,
    cfg: RunConfig,
    provider: Provider,
    judge: Judge,
    store: RunStore,
    progress: Callable[[dict[str, Any]], None] = lambda info: None,
) -> RunResult:
    t_start = time.perf_counter()
    target = get_target(cfg.target)
    stages = ("static", "compile") if cfg.compile_only else ("static", "compile", "verify", "profile")
    # A budget of one candidate: its profile times the baselines beside it, so the report need
    # not profile it again for them (half of an offline eval problem's wall time)
    alone = cfg.rounds * cfg.samples == 1 and not cfg.compile_only
    opts = JudgeOptions(
        stages=stages, profile_shapes=cfg.profile_shapes(), baselines=list(cfg.baselines) if alone else []
    )
    ctx = prompting.PromptContext(spec, cfg.dtype, target, cfg.target_pct, shapes=cfg.profile_shapes())
    system = prompting.system_prompt(ctx)
    task = prompting.task_prompt(ctx)

    state = store.load_state() or {}
    start_round = state.get("round", 0)
    convs: list[list[Message]] = state.get("conversations") or [
        [{"role": "system", "content": system}, {"role": "user", "content": task}] for _ in range(cfg.samples)
    ]
    if not state:
        store.transcript(kind="prompt", round=0, sample=-1, role="system", text=system)
        store.transcript(kind="prompt", round=0, sample=-1, role="user", text=task)
    usage = Usage(**state.get("usage", {}))
    counts: Counter[str] = Counter(state.get("verdicts", {}))
    judged = state.get("judged", 0)
    first_hit: dict[str, Any] = state.get("first_hit", {})
    recorded = store.recorded_answers()

    # Rebuild what the earlier part of a resumed run learnt.
    best: Best | None = None
    for rec in store.candidates():
        v = Verdict.from_json(rec["verdict"])
        ans = recorded.get((rec["round"], rec["sample"]))
        if ans is not None:
            provider.observe(Slot(rec["round"], rec["sample"]), _answer(ans), v)
        best = _better(best, rec["id"], (store.path / "candidates" / f"{rec['id']}.py").read_text(), v, cfg)

    stop = ""
    r = start_round
    try:
        for r in range(start_round, cfg.rounds):
            if best and best.min_pct >= cfg.target_pct and not cfg.compile_only:
                stop = f"best reached {cfg.target_pct:.0f}% of SOL on every shape"
                break
            if cfg.max_tokens and usage.total >= cfg.max_tokens:
                stop = f"token budget spent ({usage.total} >= {cfg.max_tokens})"
                break
            # (a wait for this run's turn on a GPU other runs share is not the run's time)
            if cfg.time_limit_s and time.perf_counter() - t_start - judge.turn_wait(t_start) >= cfg.time_limit_s:
                stop = f"time budget spent ({cfg.time_limit_s:.0f} s)"
                break
            store.event("round", round=r)
            progress({"round": r, "phase": "asking", "judged": judged, "verdicts": dict(counts), "best": best})
            slots = [Slot(r, s) for s in range(cfg.samples)]
            # answers already recorded for this round (an interrupted run) are not asked again
            missing = [s for s in slots if (s.round, s.sample) not in recorded]
            if missing:
                if provider.uses_llm:  # (a GPU shared with other runs is theirs while the LLM answers)
                    judge.lend_gpu()
                try:
                    new = provider.propose([_trim(convs[s.sample]) for s in missing], missing)
                finally:
                    if provider.uses_llm:
                        judge.want_gpu()
                for s, a in zip(missing, new):
                    usage.add(a.usage)
                    rec = {
                        "kind": "answer", "round": s.round, "sample": s.sample, "text": a.text,
                        "usage": vars(a.usage), "model": a.model, "provider": provider.name,
                        "seconds": a.seconds, "meta": a.meta,
                    }  # fmt: skip
                    store.transcript(**rec)
                    recorded[(s.round, s.sample)] = rec
            answered = [(s, _answer(recorded[(s.round, s.sample)])) for s in slots if (s.round, s.sample) in recorded]
            if not answered:
                stop = "the provider has nothing more to propose (search space exhausted)"
                break

            sources = [prompting.extract_code(a.text) or "" for _, a in answered]
            keys = [verdict_key(src, spec, cfg.dtype, cfg.target, opts) for src in sources]
            verdicts: list[Verdict | None] = [store.cached_verdict(k) for k in keys]
            todo = [i for i, v in enumerate(verdicts) if v is None and sources[i]]
            progress({"round": r, "phase": "judging", "judged": judged, "verdicts": dict(counts), "best": best})
            if todo:
                for i, v in zip(todo, judge.evaluate_many([sources[i] for i in todo], spec, cfg.dtype, opts)):
                    verdicts[i] = v
            for i, ((slot, ans), src) in enumerate(zip(answered, sources)):
                v = verdicts[i] or Verdict(
                    STATIC_REJECTED, "the answer holds no ```python code block with the module",
                    spec.name, cfg.dtype, cfg.target, "",
                )  # fmt: skip
                cid = f"c{slot.round:02d}_{slot.sample:02d}"
                store.save_candidate(cid, keys[i], src, v, slot.round, slot.sample)
                provider.observe(slot, ans, v)
                counts[v.status] += 1
                judged += 1
                prev = best
                best = _better(best, cid, src, v, cfg)
                if best is not prev and best and best.min_pct >= cfg.target_pct and not first_hit:
                    first_hit = {
                        "round": r, "judged": judged, "llm_calls": usage.requests, "tokens": usage.total,
                        "wall_s": time.perf_counter() - t_start, "at": v.finished_at,
                    }  # fmt: skip
                store.event(
                    "judged", id=cid, status=v.status, min_pct=_score(v, cfg.compile_only),
                    stages=v.timeline, finished_at=v.finished_at,
                )  # fmt: skip
                feedback = prompting.feedback_prompt(v, best, cfg.target_pct)
                convs[slot.sample] = convs[slot.sample] + [
                    {"role": "assistant", "content": ans.text},
                    {"role": "user", "content": feedback},
                ]
                store.transcript(kind="feedback", round=r, sample=slot.sample, role="user", text=feedback)
            store.write_json(
                "state.json",
                {
                    "round": r + 1, "conversations": convs, "usage": vars(usage), "verdicts": dict(counts),
                    "judged": judged, "first_hit": first_hit,
                },
            )  # fmt: skip
            progress({"round": r + 1, "phase": "done", "judged": judged, "verdicts": dict(counts), "best": best})
        else:
            r = cfg.rounds
        if not stop:
            stop = f"round budget spent ({cfg.rounds})"
        if best and best.min_pct >= cfg.target_pct and not cfg.compile_only:
            stop = f"best reached {cfg.target_pct:.0f}% of SOL on every shape"
    except KeyboardInterrupt:
        stop = "interrupted (Ctrl-C); resume with --resume"
    store.event("stop", reason=stop)
    return RunResult(stop, r, judged, dict(counts), usage, time.perf_counter() - t_start, best, first_hit)


def _answer(rec: dict[str, Any]) -> Answer:
    return Answer(rec["text"], Usage(**rec.get("usage", {})), rec.get("model", ""), 0.0, rec.get("meta", {}))


def _better(best: Best | None, cid: str, src: str, v: Verdict, cfg: RunConfig) -> Best | None:
    sc = _score(v, cfg.compile_only)
    if sc is None:
        return best
    if best is None or sc > (best.min_pct, best.mean_pct):
        return Best(cid, sc[0], sc[1], src, v)
    return best
