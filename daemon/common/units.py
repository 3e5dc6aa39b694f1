"""Numbers as people read them: ages, sizes. Shared by the CLI and the status page."""

from __future__ import annotations

import time


def age(seconds: float) -> str:
    """90 s -> "1m", 2 h 5 m -> "2h05m": short enough for a status line."""
    s = max(0, int(seconds))
    if s < 90:
        return f"{s}s"
    if s < 5400:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d"


def since(when: float, now: float) -> str:
    """A wall time as "since 14:02:11 (3m)": the local clock time, and how long ago."""
    fmt = "%H:%M:%S" if now - when < 86400 else "%Y-%m-%d %H:%M"
    return f"since {time.strftime(fmt, time.localtime(when))} ({age(now - when)})"


def gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def mib(n: int | None) -> str:
    return f"{(n or 0) / 2**20:.0f} MiB"
