"""Filesystem calls that cannot freeze the caller: one lane per share, with a deadline.

A hard NFS mount whose server stops answering does not vanish: every `stat`, `scandir` or
`open` into it blocks, uninterruptibly, until the server is back (a FUSE mount whose
process is stopped does the same). Made on the main loop, one such call freezes the
whole daemon: the other inboxes, the worker's heartbeats, the status it records, the
systemd watchdog.

So the main loop hands such calls to `Shares.call(path, fn, ...)`: the call runs in the
thread of the share (the mount) holding `path`, and the caller waits for it at most
`deadline` seconds. Each share has ONE thread and at most one call outstanding:

- a call that does not return within the deadline marks the share *not answering*
  (`Lane.hung_since`) and raises `NotAnswering`, an `OSError` (ETIMEDOUT), so every
  caller's existing "cannot read this now" path applies;
- while that call has not returned, every further call into the share raises
  `NotAnswering` at once: the hung thread is never waited for again, never multiplied;
- when it returns (the server is back), the next call runs normally and the share is
  answering again (`Lane.hung_since` is None after the first call that answers).

Callers from several threads (the main loop, the HTTP thread) take turns. A caller may
be less patient than the deadline (`patience`: the status page must answer in a second or
two); running out of patience does not mark the share, only the deadline does.

Threads are daemon threads, never joined: a thread stuck in a dead mount must not keep
the process from exiting. The clock and the wait are passed in, so tests tick a fake
clock and use events, never sleep.
"""

from __future__ import annotations

import errno
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from daemon.common.mounttable import MountEntry, find_mount, parse_mountinfo, read_mountinfo

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEADLINE_SECONDS = 10.0

# How a caller waits for a call: `wait(done, seconds)` returns whether it was set in time
# (threading.Event.wait; tests pass one that ticks a fake clock instead of sleeping).
WaitFn = Callable[[threading.Event, float], bool]


def _event_wait(done: threading.Event, seconds: float) -> bool:
    return done.wait(max(0.0, seconds))


class ShareCall(Protocol):
    """Runs `fn` in the lane of the share holding `path` (`Shares.call` bound to a
    patience); raises `NotAnswering` when the share does not answer in time."""

    def __call__(self, path: Path, fn: Callable[[], T]) -> T: ...


def direct(path: Path, fn: Callable[[], T]) -> T:
    """A `ShareCall` that calls in the caller's thread (commands that run once, tests)."""
    return fn()


class NotAnswering(OSError):
    """A call into a share did not return within its deadline, or one before it has not
    returned yet."""

    def __init__(self, share: str, message: str) -> None:
        super().__init__(errno.ETIMEDOUT, message)
        self.share = share


class _Call(Generic[T]):
    """One call handed to a lane's thread; `done` is set when it returned or raised."""

    def __init__(self, fn: Callable[[], T], started: float) -> None:
        self.fn = fn
        self.started = started
        self.done = threading.Event()
        self.value: T | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.value = self.fn()
        except BaseException as exc:  # handed to the caller, raised in its thread
            self.error = exc
        finally:
            self.done.set()

    def result(self) -> T:
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]  # set by run() when no error


@dataclass(frozen=True)
class HungShare:
    """A share not answering: where it is mounted and since when."""

    mount: str
    since: float  # monotonic
    since_wall: float


@dataclass(eq=False)
class Lane:
    """The one thread through which every call into one share goes."""

    mount: str
    deadline: float = DEADLINE_SECONDS
    _: KW_ONLY
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    wait: WaitFn = _event_wait
    hung: HungShare | None = field(default=None, init=False)
    _turn: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _calls: queue.SimpleQueue[_Call[object] | None] = field(
        default_factory=queue.SimpleQueue, init=False, repr=False
    )
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)
    _outstanding: _Call[object] | None = field(default=None, init=False, repr=False)

    @property
    def answering(self) -> bool:
        """False while a call that overran the deadline has not returned."""
        call = self._outstanding
        return self.hung is None or call is None or call.done.is_set()

    def call(self, fn: Callable[[], T], *, patience: float | None = None) -> T:
        """`fn()` in this share's thread; its value, or what it raised. Raises
        `NotAnswering` after `min(patience, deadline)` seconds without an answer."""
        budget = self.deadline if patience is None else min(patience, self.deadline)
        if not self._turn.acquire(timeout=max(0.0, budget)):
            raise NotAnswering(self.mount, self._message("busy"))
        try:
            previous = self._outstanding
            if previous is not None and not previous.done.is_set():
                # Someone less patient gave up on it: let it have the rest of its deadline.
                left = max(0.0, previous.started + self.deadline - self.clock())
                if not self.wait(previous.done, min(left, budget)):
                    self._overran(previous)
                    raise NotAnswering(self.mount, self._message("hung"))
            call: _Call[object] = _Call(fn, self.clock())
            self._outstanding = call
            self._start()
            self._calls.put(call)
            if not self.wait(call.done, budget):
                self._overran(call)
                raise NotAnswering(self.mount, self._message("hung"))
            self._outstanding = None
            if self.hung is not None:
                logger.info("the share at %s answers again after %.0f s", self.mount,
                            self.clock() - self.hung.since)
                self.hung = None
            return call.result()  # type: ignore[return-value]  # fn's own value
        finally:
            self._turn.release()

    def _overran(self, call: _Call[object]) -> None:
        if self.hung is None and self.clock() - call.started >= self.deadline:
            self.hung = HungShare(self.mount, self.clock(), self.wall())
            # The folders on it say so, once and then each minute (FolderPresence).
            logger.info(
                "the share at %s is not answering: a call into it has not returned for "
                "%.0f s (a hard NFS mount whose server is down?); its folders wait",
                self.mount, self.deadline,
            )

    def _message(self, why: str) -> str:
        if why == "busy":
            return f"the share at {self.mount} is busy with another call"
        return f"not answering (the share at {self.mount} hangs)"

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._serve, name=f"share {self.mount}", daemon=True
            )
            self._thread.start()

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            call.run()

    def close(self) -> None:
        """Let the thread end once it is free (never waited for)."""
        if self._thread is not None:
            self._calls.put(None)
            self._thread = None


class Shares:
    """The lanes, one per mount point, found from the mount table.

    Safe to use from several threads. `refresh()` re-reads the mount table (cheap: it is
    /proc, which never hangs); a path is placed by its absolute text, never resolved
    (resolving would itself call into the share).
    """

    def __init__(
        self,
        deadline: float = DEADLINE_SECONDS,
        *,
        mountinfo: Callable[[], str] = read_mountinfo,
        lane: Callable[[str, float], Lane] = Lane,
    ) -> None:
        self.deadline = deadline
        self._mountinfo = mountinfo
        self._new_lane = lane
        self._lock = threading.Lock()
        self._lanes: dict[str, Lane] = {}
        self._entries: list[MountEntry] = []
        self._read = False

    def refresh(self) -> None:
        try:
            entries = parse_mountinfo(self._mountinfo())
        except OSError:
            return  # keep the last table
        self._entries = entries  # rebound whole: readers in other threads see old or new
        self._read = True

    def mount_of(self, path: Path | str) -> str:
        if not self._read:
            self.refresh()
        found = find_mount(os.fspath(path), self._entries)
        return found.mount_point if found is not None else "/"

    def lane(self, path: Path | str) -> Lane:
        mount = self.mount_of(path)
        with self._lock:
            lane = self._lanes.get(mount)
            if lane is None:
                lane = self._lanes[mount] = self._new_lane(mount, self.deadline)
            return lane

    def set_deadline(self, seconds: float) -> None:
        """A reloaded `limits.share_deadline_seconds`: every lane's next call on."""
        with self._lock:
            self.deadline = seconds
            for lane in self._lanes.values():
                lane.deadline = seconds

    def call(
        self, path: Path | str, fn: Callable[[], T], *, patience: float | None = None
    ) -> T:
        """`fn()` in the lane of the share holding `path` (see `Lane.call`)."""
        return self.lane(path).call(fn, patience=patience)

    def hung(self) -> list[HungShare]:
        with self._lock:
            lanes = list(self._lanes.values())
        return [lane.hung for lane in lanes if lane.hung is not None and not lane.answering]

    def close(self) -> None:
        with self._lock:
            lanes, self._lanes = list(self._lanes.values()), {}
        for lane in lanes:
            lane.close()
