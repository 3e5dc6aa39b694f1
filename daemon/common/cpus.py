"""How many CPU threads an engine uses: one answer for every engine.

`engine.threads: 0` means one thread per physical core the process may run on. Physical,
because SMT siblings share the FPUs and only add contention to GEMMs and OCR; within the
affinity mask (taskset, systemd's CPUAffinity=, a container's cpuset), because more
threads than allowed CPUs only queue behind each other. psutil only; no torch here.
"""

from __future__ import annotations

import os


def usable_cores() -> int:
    """Physical cores, capped by the CPUs this process may run on; at least 1."""
    import psutil

    physical = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        allowed = physical
    return max(1, min(physical, allowed))


def resolve_threads(threads: int) -> int:
    """The configured thread count, or `usable_cores()` for 0."""
    return threads if threads > 0 else usable_cores()
