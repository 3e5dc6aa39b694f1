"""What a `Watcher` is built from: its settings and what it calls out to.

`WatcherSettings` holds the timings and the folders never scanned, read from the
configuration (`from_config`); `WatcherIO` the functions and objects it calls (the stat,
the folder probe, the mount table, the observers, the clock, the share lanes), which tests
replace with fakes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from daemon.common.shares import Shares
from daemon.intake.observers import ObserverFactory, default_observer_factory
from daemon.intake.presence import ProbeFn, probe_folder
from daemon.intake.stability import DEFAULT_OPEN_WRITE_CAP_SECONDS, StatFn

if TYPE_CHECKING:
    from daemon.config.settings import Config


@dataclass(frozen=True)
class WatcherSettings:
    """How the watcher decides: the timings and the folders it never scans.

    `exclude_dirs`: folders never scanned even when inside an inbox (the outbox, archive,
    failed, duplicates and state folders, so a misconfiguration cannot loop).
    `poll_interval`: seconds between a polling observer's snapshots; each one lists and
    stats the whole inbox tree over the network. `open_write_cap_seconds`: how long after
    its last write event a file still open for writing is held at most (in case its
    close event was lost). `join_timeout`: how long stopping waits for an observer.
    """

    stability_seconds: float
    rescan_seconds: float
    empty_stability_seconds: float = 60.0
    open_write_cap_seconds: float = DEFAULT_OPEN_WRITE_CAP_SECONDS
    poll_interval: float = 5.0
    exclude_dirs: tuple[Path, ...] = ()
    join_timeout: float = 5.0
    max_queued_hints: int = 100_000

    @classmethod
    def from_config(cls, config: Config, *, poll_interval: float = 5.0) -> WatcherSettings:
        """The production settings: the output and state folders are never scanned."""
        return cls(
            stability_seconds=config.stability_seconds,
            rescan_seconds=config.rescan_seconds,
            poll_interval=poll_interval,
            exclude_dirs=(
                config.outbox,
                config.archive,
                config.failed,
                config.duplicates,
                config.state_dir,
            ),
        )


@dataclass(frozen=True)
class WatcherIO:
    """What the watcher calls out to; tests pass fakes.

    `stat`: how a pending file is looked at; `probe`: how an inbox folder is looked at
    every few seconds; `mountinfo_reader`: the mount table's text (None: the real one);
    `wall`: the clock for the "missing since" shown in status; `clock`: the monotonic
    clock the main loop ticks with (`tick(now)`), read only by a look asked for before
    the first tick; `shares`: the lanes every call into an inbox goes through (None: the
    watcher's own, with the default deadline).
    """

    stat: StatFn = os.lstat
    mountinfo_reader: Callable[[], str] | None = None
    observer_factory: ObserverFactory = default_observer_factory
    probe: ProbeFn = probe_folder
    wall: Callable[[], float] = time.time
    clock: Callable[[], float] = time.monotonic
    shares: Shares | None = None
