"""One rate limit on LLM requests for every agent process of an eval, wherever it runs.

A token bucket (`TokenBucket`) answers "how long must this request wait"; it never sleeps
itself, so one copy can serve a whole cluster from a Ray actor (`llmcompile.suites.ray_backend`)
without any caller holding it. An agent process finds that actor through two environment
variables the eval driver sets (`ENV_ACTOR`, and Ray's own RAY_ADDRESS), and `wait_turn()`
before each request sleeps for what the bucket says. Without them it returns at once.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

ENV_ACTOR = "LLMCOMPILE_RATE_ACTOR"  # "<namespace>/<actor name>" of the eval's bucket


class TokenBucket:
    """`rate` requests a second on average, bursts of up to `burst`."""

    def __init__(self, rate: float, burst: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"a rate limit needs rate > 0 and burst >= 1, got rate={rate} burst={burst}")
        self.rate, self.burst, self.clock = rate, burst, clock
        self.tokens, self.t = burst, clock()
        self.lock = threading.Lock()

    def reserve(self) -> float:
        """Take one token (going into debt if none is left); seconds the caller must wait."""
        with self.lock:
            now = self.clock()
            self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate)
            self.t = now
            self.tokens -= 1.0
            return max(0.0, -self.tokens / self.rate)


_remote: list = []  # the actor handle, once connected (one per process)
_remote_lock = threading.Lock()


def _actor():  # noqa: ANN202 - a Ray actor handle
    spec = os.environ.get(ENV_ACTOR)
    if not spec:
        return None
    with _remote_lock:
        if not _remote:
            import ray

            namespace, name = spec.split("/", 1)
            if not ray.is_initialized():
                ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), namespace=namespace, log_to_driver=False)
            _remote.append(ray.get_actor(name, namespace=namespace))
        return _remote[0]


def wait_turn() -> float:
    """Sleep until the eval's shared bucket lets one more request go; seconds slept."""
    actor = _actor()
    if actor is None:
        return 0.0
    import ray

    delay = float(ray.get(actor.reserve.remote()))
    if delay > 0:
        time.sleep(delay)
    return delay
