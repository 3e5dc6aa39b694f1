"""The worker process's states and the one table of legal moves between them.

    down -> starting -> idle <-> busy           (one document at a time)
    starting | idle | busy -> stopping -> down  (asked to exit: recycle, switch, shutdown)
    starting | idle | busy -> down              (died, killed at a deadline, engine gone)
    down -> recovering -> starting              (after a fault: backoff, then a restart)
    down -> fatal                               (the engine cannot run, no fallback)
    idle -> stopping -> down -> unloaded -> starting
                                   (idle too long: the model's memory goes back to the
                                    system; the next queued document starts a worker)

`down` and `recovering` both mean "no worker process": after a planned stop (recycle,
engine switch, shutdown) the next worker is a plain start; after a crash, a hang or an
internal error it is a restart, counted and backed off. `fatal` is the end: the engine
cannot run here and there is no fallback. `unloaded` is also "no worker process", but
on purpose and healthy: `worker.idle_unload_seconds` passed with nothing to do, and only a
queued document starts the next one (a plain start, not a restart).

Every change goes through `check_transition`, as job states do (daemon/jobs/states.py), so
a move the supervisor was never meant to make raises instead of leaving a worker nobody
watches. The public `Phase` (daemon/common/live.py) is what status shows of a state.
"""

from __future__ import annotations

import enum

from daemon.common.live import Phase


class WorkerState(enum.Enum):
    DOWN = "down"  # no worker; the next start is planned
    RECOVERING = "recovering"  # no worker since a fault; the next start is a restart
    STARTING = "starting"  # spawned, loading the engine
    IDLE = "idle"  # ready, holding no document
    BUSY = "busy"  # working on a document
    STOPPING = "stopping"  # asked to exit; waiting for it
    FATAL = "fatal"  # the engine cannot run here and there is no fallback
    UNLOADED = "unloaded"  # no worker: idle too long; the next document starts one

    @property
    def phase(self) -> Phase:
        """What status shows: a recovering worker is down, waiting for its backoff."""
        if self is WorkerState.RECOVERING:
            return Phase.DOWN
        if self is WorkerState.UNLOADED:
            return Phase.UNLOADED
        return Phase(self.value)


_S = WorkerState

TRANSITIONS: dict[WorkerState, frozenset[WorkerState]] = {
    # down -> unloaded: the worker that was asked to exit for being idle is gone.
    _S.DOWN: frozenset({_S.STARTING, _S.RECOVERING, _S.FATAL, _S.UNLOADED}),
    # Another fault before the restart (an internal error) backs off again.
    _S.RECOVERING: frozenset({_S.STARTING, _S.RECOVERING}),
    _S.STARTING: frozenset({_S.IDLE, _S.STOPPING, _S.DOWN}),
    _S.IDLE: frozenset({_S.BUSY, _S.STOPPING, _S.DOWN}),
    # busy -> stopping: recycled at a page boundary (memory), the document resumes later.
    _S.BUSY: frozenset({_S.IDLE, _S.STOPPING, _S.DOWN}),
    _S.STOPPING: frozenset({_S.DOWN}),
    _S.FATAL: frozenset(),
    # unloaded -> recovering: an internal error while no worker runs (see Supervisor).
    _S.UNLOADED: frozenset({_S.STARTING, _S.RECOVERING}),
}


class IllegalTransition(Exception):
    def __init__(self, old: WorkerState, new: WorkerState) -> None:
        super().__init__(f"worker: illegal transition {old.value} -> {new.value}")
        self.old = old
        self.new = new


def check_transition(old: WorkerState, new: WorkerState) -> None:
    if new not in TRANSITIONS[old]:
        raise IllegalTransition(old, new)
