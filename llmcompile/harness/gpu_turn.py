"""A run's turn on a GPU it shares with other runs: they start up side by side and time one at a time.

An eval runs the next problem's agent while the last one still judges on the same GPU, so its
start-up (imports, the problem loaded, its first candidates compiled) is off the GPU's critical
path. The eval names one lock file a GPU (`ENV`); a run's judge takes an exclusive `flock` on it
in the background and lets its GPU worker create a CUDA context only once it holds it, so no two
runs ever verify or time on one GPU at once. The trusted agent process holds the lock, never the
sandboxed worker (candidate code could release it); the kernel releases it when the process ends,
however it ends. Light: nothing here imports torch.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time

ENV = "LLMCOMPILE_GPU_TURN"  # the lock file of this run's GPU, set by the eval runner


class Turn:
    """This process's turn on its GPU, asked for on creation and held until `release` or exit."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.asked = time.perf_counter()
        self.taken: float | None = None  # perf_counter when held
        self.taken_at: float | None = None  # time.time when held
        self.error = ""  # why no lock could be taken (the run then goes on without waiting)
        self._fd: int | None = None
        self._released = False
        self._state = threading.Lock()  # `release` and the lock's arrival may race
        self._settled = threading.Event()  # held, or given up
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            self.error = f"the GPU's turn file {path} could not be opened ({e}): this run did not wait for its turn"
            self._grant()
            return
        threading.Thread(target=self._take, args=(fd,), daemon=True, name="llmcompile-gpu-turn").start()

    def _take(self, fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX)  # blocks while another run on this GPU holds it
        with self._state:
            if self._released:  # released before it was ever held (the run ended first)
                os.close(fd)
                return
            self._fd = fd
        self._grant()

    def _grant(self) -> None:
        self.taken, self.taken_at = time.perf_counter(), time.time()
        self._settled.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the turn is this process's (True), or it is given up or `timeout` passes."""
        self._settled.wait(timeout)
        return self.held

    @property
    def held(self) -> bool:
        return self.taken is not None and not self._released

    def waited(self, since: float) -> float:
        """Seconds (perf_counter) spent waiting for the turn after `since`, so far."""
        end = self.taken if self.taken is not None else time.perf_counter()
        return max(0.0, end - max(self.asked, since))

    def release(self) -> None:
        """Give the turn up, held or still awaited (a thread waiting for it stops waiting)."""
        with self._state:
            self._released = True
            if self._fd is not None:
                os.close(self._fd)  # closing the only descriptor releases the flock
                self._fd = None
        self._settled.set()


def from_env() -> Turn | None:
    """The turn this run must take, where the eval named a lock file for its GPU."""
    path = os.environ.get(ENV)
    return Turn(path) if path else None
