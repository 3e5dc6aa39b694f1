"""How many CPU threads an engine uses: one answer for every engine.

`engine.threads: 0` means one thread per physical core the process may run on. Physical,
because SMT siblings share the FPUs and only add contention to GEMMs and OCR; within the
affinity mask (taskset, systemd's CPUAffinity=, a container's cpuset), because more
threads than allowed CPUs only queue behind each other. psutil only; no torch here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


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


# The environment variables that cap the instruction sets torch's CPU kernels use: ATen's
# own kernels, oneDNN's (bf16 GEMMs, convolutions) and MKL's (fp32 GEMMs: not capped by the
# first two). All three reproduce an older CPU on a newer one; the benches record them, and
# the page estimate is timed again under other caps.
ISA_CAP_VARIABLES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def isa_caps(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ISA caps set in `env` (default: this process's environment), by variable."""
    env = os.environ if env is None else env
    return {name: env[name] for name in ISA_CAP_VARIABLES if name in env}
