"""The state database's upkeep, in the main loop's ticks: the file stays bounded.

- Every CHECKPOINT_EVERY seconds the WAL is checkpointed and truncated (copied as far as
  a reader allows when one holds it), so it cannot grow without bound while the status
  page or `docinbox status` read.
- Every PRUNE_EVERY seconds, busy or idle: delivered and given-up events older than
  `hooks.retention_days` are deleted, and old page times; then the free pages are given
  back to the file system (incremental_vacuum).

Pruning does not wait for an idle daemon: a queue that never empties (a scanner feeding
an inbox all day) would never prune, and the file would grow with it. So no tick does
much of it either: PRUNE_BATCH rows a table and VACUUM_PAGES_PER_TICK pages at most, each
in a short transaction of its own, and a backlog (months of events after an upgrade, a
retention shortened) is worked off over the following ticks, not in one long hold of the
write lock that stalls the main loop, its watchdog ping and the readers.

Time is passed in (`tick(now)`, wall-clock seconds): tests tick, never sleep.
"""

from __future__ import annotations

from dataclasses import dataclass

from daemon.jobs.db import Checkpoint
from daemon.jobs.store import Store

CHECKPOINT_EVERY = 60.0
PRUNE_EVERY = 600.0
PRUNE_BATCH = 500  # rows of a table deleted in one tick (tens of milliseconds)
VACUUM_PAGES_PER_TICK = 2048  # 8 MiB of 4 KiB pages


@dataclass(frozen=True)
class UpkeepDone:
    """What one tick did."""

    checkpoint: Checkpoint | None = None
    deliveries_pruned: int = 0
    page_times_pruned: int = 0
    pages_freed: int = 0


def _due(now: float, at: float, every: float) -> bool:
    # A wall clock set back must not put the next run off by as much.
    return now >= at or at - now > every


class Upkeep:
    def __init__(self, store: Store, retention_seconds: float) -> None:
        self.store = store
        self.retention_seconds = retention_seconds
        self.next_checkpoint = 0.0
        self.next_prune = 0.0
        self.pruning = False  # the last batch was full: more is due, at the next tick
        self.vacuuming = False  # free pages are being given back, a batch per tick

    def tick(self, now: float) -> UpkeepDone | None:
        """Do a bounded part of what is due at `now`, whether documents are being
        converted or not. None when nothing was due."""
        checkpoint = None
        if _due(now, self.next_checkpoint, CHECKPOINT_EVERY):
            self.next_checkpoint = now + CHECKPOINT_EVERY
            checkpoint = self.store.checkpoint()
        pruned = times = 0
        if self.pruning or _due(now, self.next_prune, PRUNE_EVERY):
            if not self.pruning:  # a pass begins; its batches do not move the schedule
                self.next_prune = now + PRUNE_EVERY
            pruned = self.store.prune_deliveries(now - self.retention_seconds, PRUNE_BATCH)
            times = self.store.prune_page_times(now, PRUNE_BATCH)
            self.pruning = pruned >= PRUNE_BATCH or times >= PRUNE_BATCH
            self.vacuuming = True
        freed = 0
        if self.vacuuming:
            freed = self.store.incremental_vacuum(VACUUM_PAGES_PER_TICK)
            self.vacuuming = freed > 0 and self.store.free_pages() > 0
        if checkpoint is None and not (pruned or times or freed):
            return None
        return UpkeepDone(checkpoint, pruned, times, freed)
