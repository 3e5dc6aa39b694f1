"""Job states and the one table of legal transitions.

A job is one arrival of a file in an inbox. Its life:

    queued -> running -> done | failed
    queued | running -> duplicate   (same content as a document already done or queued)
    running -> queued               (worker crashed or daemon stopped mid-document: resume)
    failed -> queued                (`docinbox retry`)
    done -> queued                  (`docinbox reprocess`)

Everything that changes a job's state goes through `check_transition`, so an illegal move
(say done -> running) is a bug that raises instead of silently corrupting the queue.
"""

from __future__ import annotations

import enum


class JobState(str, enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    DUPLICATE = "duplicate"


TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.RUNNING, JobState.FAILED, JobState.DUPLICATE}),
    JobState.RUNNING: frozenset({JobState.DONE, JobState.FAILED, JobState.QUEUED}),
    JobState.FAILED: frozenset({JobState.QUEUED}),
    JobState.DONE: frozenset({JobState.QUEUED}),
    JobState.DUPLICATE: frozenset(),
}

TERMINAL: frozenset[JobState] = frozenset(
    {JobState.DONE, JobState.FAILED, JobState.DUPLICATE}
)


class IllegalTransition(Exception):
    def __init__(self, job_id: int, old: JobState, new: JobState) -> None:
        super().__init__(f"job {job_id}: illegal transition {old.value} -> {new.value}")
        self.job_id = job_id
        self.old = old
        self.new = new


def check_transition(job_id: int, old: JobState, new: JobState) -> None:
    if new not in TRANSITIONS[old]:
        raise IllegalTransition(job_id, old, new)
