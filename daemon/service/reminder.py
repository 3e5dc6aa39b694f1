"""A lasting problem said once, then reminded at a slow pace, and its end said once.

The main loop ticks four times a second; a condition that fails every tick (a full state
disk, a database another process holds) would otherwise fill the journal with the same
line and bury everything else. The clock is passed in, so tests tick.
"""

from __future__ import annotations

import logging

REMIND_EVERY = 60.0
# How long things must keep working before the problem is called over: a full disk can
# let a small write through now and then, and each flip must not print two more lines.
SETTLE = 10.0


class Reminder:
    def __init__(
        self, log: logging.Logger, every: float = REMIND_EVERY, settle: float = SETTLE
    ) -> None:
        self.log = log
        self.every = every
        self.settle = settle
        self.since: float | None = None
        self.next_at = 0.0
        self.clear_since: float | None = None

    @property
    def active(self) -> bool:
        return self.since is not None

    def problem(self, now: float, message: str, level: int = logging.WARNING) -> None:
        """It failed (again) at `now`: logged if new, or when a reminder is due."""
        self.clear_since = None
        if self.since is None:
            self.since = now
            self.log.log(level, "%s", message)
        elif now >= self.next_at:
            self.log.log(level, "%s (still, for %.0f s)", message, now - self.since)
        else:
            return
        self.next_at = now + self.every

    def resolved(self, now: float, message: str) -> None:
        """It worked at `now`. Once it has kept working for `settle` seconds (so call this
        on every success), the end of a reported problem is logged once."""
        if self.since is None:
            return
        if self.clear_since is None:
            self.clear_since = now
        if now - self.clear_since >= self.settle:
            self.log.info("%s (after %.0f s)", message, self.clear_since - self.since)
            self.since = self.clear_since = None
