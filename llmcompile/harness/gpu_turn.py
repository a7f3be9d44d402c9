"""A run's turn on a GPU it shares with other runs: they start up side by side and time one at a time.

An eval runs the next problem's agent while the last one still judges on the same GPU, so its
start-up (imports, the problem loaded, its first candidates compiled) is off the GPU's critical
path. The eval names one lock file a GPU (`ENV`); a run's judge takes an exclusive `flock` on it
in the background and lets its GPU worker create a CUDA context only once it holds it, so no two
runs ever verify or time on one GPU at once. The trusted agent process holds the lock, never the
sandboxed worker (candidate code could release it); the kernel releases it when the process ends,
however it ends. A run that waits on something else for a while (an LLM's answer) may lend the
turn (`pause`) and ask for it again (`resume`): its GPU worker, idle meanwhile, keeps its CUDA
context and the bandwidth it measured. Light: nothing here imports torch.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time

ENV = "LLMCOMPILE_GPU_TURN"  # the lock file of this run's GPU, set by the eval runner


class Turn:
    """This process's turn on its GPU, asked for on creation and held until `release` or exit (or
    lent, from `pause` until `resume` brings it back)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.asked = time.perf_counter()
        self.taken: float | None = None  # perf_counter when held, the latest time
        self.taken_at: float | None = None  # time.time when first held
        self.error = ""  # why no lock could be taken (the run then goes on without waiting)
        self._fd: int | None = None
        self._released = False
        self._holding = False  # held now: taken, and neither lent nor released since
        self._paused = False  # lent, and not yet asked for again
        self._waits: list[list[float | None]] = []  # [asked, taken] of every wait for the turn
        self._lent: list[list[float | None]] = []  # [lent, taken again] of every time it was lent
        self._state = threading.Lock()  # `release` and the lock's arrival may race
        self._settled = threading.Event()  # held, or given up
        self._ask(self.asked)

    def _ask(self, at: float) -> None:
        self._waits.append([at, None])
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            self.error = (
                f"the GPU's turn file {self.path} could not be opened ({e}): this run did not wait for its turn"
            )
            self._grant()
            return
        threading.Thread(target=self._take, args=(fd,), daemon=True, name="llmcompile-gpu-turn").start()

    def _take(self, fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX)  # blocks while another run on this GPU holds it
        with self._state:
            if self._released:  # released while it was awaited (the run ended first)
                os.close(fd)
                return
            self._fd = fd
            self._grant()

    def _grant(self) -> None:
        """Held (under `_state`, or where no other thread can see the turn yet)."""
        now = time.perf_counter()
        self.taken, self._holding = now, True
        if self.taken_at is None:
            self.taken_at = time.time()
        for span in self._waits[-1:] + self._lent[-1:]:
            if span[1] is None:
                span[1] = now
        self._settled.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the turn is this process's (True), or it is given up or `timeout` passes."""
        self._settled.wait(timeout)
        return self.held

    @property
    def held(self) -> bool:
        return self._holding and not self._released

    @property
    def coming_back(self) -> bool:
        """Held before, and lent since: not this run's until it is asked for and held again."""
        return self.taken is not None and not self._holding and not self._released

    @property
    def lent(self) -> bool:
        """Lent by `pause` and not yet asked for again."""
        return self._paused

    def waited(self, since: float) -> float:
        """Seconds (perf_counter) spent waiting for the turn after `since`, so far (every wait: the
        first, and each after the turn was lent)."""
        return _overlap(self._waits, since)

    def lent_for(self) -> float:
        """Seconds (perf_counter) the turn was another run's after this run first held it: from each
        `pause` until it was held again (so far, where it is still lent or awaited)."""
        return _overlap(self._lent, 0.0)

    def pause(self) -> bool:
        """Lend the turn: the next run waiting for the GPU takes it. False (nothing lent) where it is
        not held now, or no lock was taken (the file could not be opened)."""
        with self._state:
            if self._fd is None or self._released or self._paused:
                return False
            os.close(self._fd)  # closing the only descriptor releases the flock
            self._fd, self._holding, self._paused = None, False, True
            self._lent.append([time.perf_counter(), None])
            self._settled.clear()
        return True

    def resume(self) -> None:
        """Ask for the lent turn again (in the background: `wait` blocks until it is held)."""
        with self._state:
            if not self._paused or self._released:
                return
            self._paused = False
            self._ask(time.perf_counter())

    def release(self) -> None:
        """Give the turn up, held, lent or still awaited (a thread waiting for it stops waiting)."""
        with self._state:
            self._released, self._paused = True, False
            if self._fd is not None:
                os.close(self._fd)  # closing the only descriptor releases the flock
                self._fd = None
            now = time.perf_counter()
            for span in self._waits + self._lent:  # (what was awaited or lent ends here)
                if span[1] is None:
                    span[1] = now
        self._settled.set()


def _overlap(spans: list[list[float | None]], since: float) -> float:
    """Seconds of the [start, end] spans (an end of None: now) after `since`."""
    now, total = time.perf_counter(), 0.0
    for start, end in spans:
        total += max(0.0, (now if end is None else end) - max(start or 0.0, since))
    return total


def from_env() -> Turn | None:
    """The turn this run must take, where the eval named a lock file for its GPU."""
    path = os.environ.get(ENV)
    return Turn(path) if path else None
