"""LLM providers behind one small interface: `propose(conversations) -> answers`.

- `OpenAIProvider`: any OpenAI-compatible chat endpoint (OpenAI, vLLM, SGLang, Ollama,
  llama.cpp, routers) through the `openai` package, with tenacity retries.
- `ReplayProvider`: answers from a recorded run's transcript, for exact reproduction.
- The offline search (no LLM at all) lives in `llmcompile.agent.offline`, behind the same interface.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tenacity import RetryCallState, retry, retry_if_exception, stop_after_attempt

from llmcompile.agent import ratelimit

Message = dict[str, str]  # {"role": "system"|"user"|"assistant", "content": ...}


def choose_llm(llm: str, model: str) -> str:
    """`auto`: the OpenAI-compatible endpoint when a model and a key are configured, else the
    offline search (which says so); any other choice stands."""
    if llm != "auto":
        return llm
    return "openai" if model and os.environ.get("OPENAI_API_KEY") else "offline"


class ProviderError(RuntimeError):
    """The provider cannot answer: missing key, unknown model, dead endpoint, bad transcript."""


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    requests: int = 0

    def add(self, other: Usage) -> None:
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.requests += other.requests

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class Answer:
    text: str
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    seconds: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)  # e.g. the offline search's knobs


@dataclass
class Slot:
    """Which answer is asked for: (round, sample). Replay finds its recorded answer by it."""

    round: int
    sample: int


class Provider(Protocol):
    name: str
    uses_llm: bool

    def propose(self, conversations: Sequence[list[Message]], slots: Sequence[Slot]) -> list[Answer]: ...

    def observe(self, slot: Slot, answer: Answer, verdict: Any) -> None: ...


# --------------------------------------------------------------------------- openai

RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


def _retryable(e: BaseException) -> bool:
    import openai

    if isinstance(e, (openai.APITimeoutError, openai.APIConnectionError)):
        return True
    return isinstance(e, openai.APIStatusError) and e.status_code in RETRY_STATUS


def _wait(state: RetryCallState) -> float:
    """Retry-After when the server sends it (capped), else exponential backoff."""
    e = state.outcome.exception() if state.outcome else None
    resp = getattr(e, "response", None)
    if resp is not None:
        ra = resp.headers.get("retry-after")
        if ra:
            try:
                return min(float(ra), 60.0)
            except ValueError:
                pass
    return min(0.5 * 2 ** (state.attempt_number - 1), 30.0)


class OpenAIProvider:
    name = "openai"
    uses_llm = True

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        max_tokens: int = 8192,
        temperature: float = 0.7,
        timeout: float = 300.0,
        attempts: int = 6,
        parallel: int = 8,
    ) -> None:
        key = api_key or os.environ.get("OPENAI_API_KEY")
        if not key:
            raise ProviderError(
                "no API key: set OPENAI_API_KEY (any non-empty value for a local server that ignores it), "
                "or run without --llm openai to use the offline search"
            )
        import openai  # lazily: the offline default must work where openai is not installed

        self.model = model
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.parallel = parallel
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL")
        # our own retries (tenacity, Retry-After aware), not the client's
        self.client = openai.OpenAI(api_key=key, base_url=self.base_url, timeout=timeout, max_retries=0)
        self._chat = retry(
            retry=retry_if_exception(_retryable), wait=_wait, stop=stop_after_attempt(attempts), reraise=True
        )(self._chat_once)

    def _chat_once(self, messages: list[Message]) -> Answer:
        ratelimit.wait_turn()  # the eval's shared limit, when run on a cluster (else a no-op)
        t0 = time.perf_counter()
        resp = self.client.chat.completions.create(
            model=self.model, messages=messages, max_tokens=self.max_tokens, temperature=self.temperature
        )
        u = resp.usage
        usage = Usage(u.prompt_tokens if u else 0, u.completion_tokens if u else 0, 1)
        text = resp.choices[0].message.content or "" if resp.choices else ""
        return Answer(text, usage, resp.model or self.model, time.perf_counter() - t0)

    def _ask(self, messages: list[Message]) -> Answer:
        import openai

        where = self.base_url or "api.openai.com"
        try:
            return self._chat(messages)
        except openai.AuthenticationError as e:
            raise ProviderError(f"the endpoint {where} refused the API key: {e.message}") from None
        except openai.NotFoundError as e:
            raise ProviderError(f"model {self.model!r} or endpoint {where} not found: {e.message}") from None
        except openai.APIConnectionError as e:
            raise ProviderError(f"cannot reach the LLM endpoint {where}: {e}") from None
        except openai.APIStatusError as e:
            raise ProviderError(f"the endpoint {where} answered HTTP {e.status_code}: {e.message}") from None

    def propose(self, conversations: Sequence[list[Message]], slots: Sequence[Slot]) -> list[Answer]:
        with ThreadPoolExecutor(max(1, min(self.parallel, len(conversations)))) as pool:
            return list(pool.map(self._ask, conversations))

    def observe(self, slot: Slot, answer: Answer, verdict: Any) -> None:
        pass


# --------------------------------------------------------------------------- replay


class ReplayProvider:
    """Answers exactly as recorded in RUN_DIR/transcript.jsonl, by (round, sample)."""

    name = "replay"
    uses_llm = False  # nothing is asked of any LLM now; the answers were recorded earlier

    def __init__(self, run_dir: str | Path) -> None:
        path = Path(run_dir) / "transcript.jsonl"
        if not path.is_file():
            raise ProviderError(f"no transcript to replay at {path}")
        self.answers: dict[tuple[int, int], Answer] = {}
        self.recorded_provider = ""
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("kind") == "answer":
                self.answers[(rec["round"], rec["sample"])] = Answer(
                    rec["text"], Usage(**rec.get("usage", {})), rec.get("model", ""), 0.0, rec.get("meta", {})
                )
                self.recorded_provider = rec.get("provider", "")
        self.uses_llm = False

    def propose(self, conversations: Sequence[list[Message]], slots: Sequence[Slot]) -> list[Answer]:
        out = []
        for s in slots:
            a = self.answers.get((s.round, s.sample))
            if a is None:
                raise ProviderError(f"the transcript has no answer for round {s.round} sample {s.sample}")
            out.append(a)
        return out

    def observe(self, slot: Slot, answer: Answer, verdict: Any) -> None:
        pass
