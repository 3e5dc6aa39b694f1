"""One CPU count for every engine (daemon/common/cpus.py)."""

from __future__ import annotations

import os

import psutil
import pytest

from daemon.common.cpus import resolve_threads, usable_cores


def test_configured_threads_win() -> None:
    assert resolve_threads(3) == 3
    assert resolve_threads(0) == usable_cores() >= 1


def test_affinity_mask_caps_the_physical_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    # taskset / CPUAffinity= / a cpuset: 8 physical cores, 2 allowed -> 2 threads.
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 8)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert usable_cores() == 2
    # SMT: 4 logical CPUs allowed on 2 physical cores -> 2 threads.
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 2)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert usable_cores() == 2


def test_without_affinity_support_physical_cores_count(monkeypatch: pytest.MonkeyPatch) -> None:
    def unsupported(pid: int) -> set[int]:
        raise OSError("not supported")

    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 6)
    monkeypatch.setattr(os, "sched_getaffinity", unsupported)
    assert usable_cores() == 6
