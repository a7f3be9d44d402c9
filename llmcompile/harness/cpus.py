"""How many cores a judge may keep busy (light: the eval drivers import it without torch)."""

from __future__ import annotations

import os


def host_cpus() -> int:
    """LLMCOMPILE_CPUS where an eval shares the host between several agents (one a GPU), else
    the cores this process may run on (its affinity, so a `taskset` share counts, not the host)."""
    given = os.environ.get("LLMCOMPILE_CPUS", "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (not Linux)
        return os.cpu_count() or 2
