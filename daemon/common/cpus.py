"""How many CPU threads an engine uses: one answer for every engine.

`engine.threads: 0` means one thread per physical core the process may run on. Physical,
because SMT siblings share the FPUs and only add contention to GEMMs and OCR; within the
affinity mask (taskset, systemd's CPUAffinity=, a container's cpuset), because more
threads than allowed CPUs only queue behind each other. And which instructions torch's
kernels use here (/proc/cpuinfo's flags and torch's ISA caps), which the engine's precision
follows. psutil only; no torch here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


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


def cpu_flags() -> set[str]:
    """x86 feature flags from /proc/cpuinfo (empty where it does not exist, e.g. macOS)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.partition(":")[2].split())
    return set()


# Values of torch's own ISA caps under which it no longer uses native bf16 instructions.
_ATEN_NO_BF16 = {"default", "avx2"}
_ONEDNN_NO_BF16 = {"sse41", "avx", "avx2", "avx2_vnni", "avx512_core", "avx512_core_vnni"}


def native_bf16(
    flags: set[str] | None = None, env: dict[str, str] | os._Environ[str] | None = None
) -> bool:
    """Whether torch computes bf16 natively here (AVX512_BF16 or AMX, and not capped).

    torch's ISA caps count: with ATEN_CPU_CAPABILITY=avx2 or ONEDNN_MAX_CPU_ISA=AVX2 (set by
    a user to work around a kernel bug, or to reproduce an AVX2 box) torch emulates bf16
    even on an AMX CPU, and bf16 is then the slowest choice.
    """
    flags = cpu_flags() if flags is None else flags
    env = os.environ if env is None else env
    if env.get("ATEN_CPU_CAPABILITY", "").lower() in _ATEN_NO_BF16:
        return False
    if env.get("ONEDNN_MAX_CPU_ISA", "").lower() in _ONEDNN_NO_BF16:
        return False
    return bool({"avx512_bf16", "amx_bf16"} & flags)


def vector_int8(
    flags: set[str] | None = None, env: dict[str, str] | os._Environ[str] | None = None
) -> bool:
    """Whether torch's weight-only int8 kernel (`_weight_int8pack_mm`) is vectorised here.

    On x86 it is from AVX2 on. Below that (the SSE4.2-only class: Celeron J4125/N5105, or
    ATEN_CPU_CAPABILITY=default, which /proc/cpuinfo does not show) it runs scalar code:
    one decode step of MinerU's decoder (24 layers, one row, one thread, torch 2.13,
    capped to SSE4.2 on an EPYC) took 872 ms in int8 with bf16 activations, 657 ms with
    fp32 ones, and 268 ms as a dense fp32 GEMM; at 4 rows 2,954 ms against 351 ms. Other
    architectures (arm64) and unknown CPUs are not judged here: they keep int8.
    """
    flags = cpu_flags() if flags is None else flags
    env = os.environ if env is None else env
    if env.get("ATEN_CPU_CAPABILITY", "").lower() == "default":
        return False
    x86 = bool({"sse2", "sse4_2"} & flags)
    return not x86 or "avx2" in flags


def amx_tiles(flags: set[str], env: dict[str, str] | os._Environ[str]) -> bool:
    """AMX tiles that oneDNN uses: the flag, and no ONEDNN_MAX_CPU_ISA cap below them."""
    cap = env.get("ONEDNN_MAX_CPU_ISA", "").lower()
    return "amx_bf16" in flags and (not cap or cap == "all" or "amx" in cap)
