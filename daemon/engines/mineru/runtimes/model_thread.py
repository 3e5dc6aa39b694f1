"""One OS thread for every torch call of a loaded model: OpenMP's spinning stays on.

torch's CPU kernels run on OpenMP (GNU libgomp in the PyPI wheels). libgomp gives each OS
thread that starts a parallel region a pool of its own, and counts every pool's threads; as
soon as there are more of them than CPUs, its idle threads spin 100 times (instead of
300,000) before they sleep, so every parallel region afterwards pays a futex wake-up. The
decoder's step is ~170 GEMVs and a few hundred small ops: on a 2-core Zen 4 a one-row step
made from a second thread of the process that loaded the model took 83-108 ms against 64-75
from the loading thread, with 5-7 ms of system time against 0.3-0.8 (~440 more futex calls a
step), alone on the machine; loaded and stepped on one (any) thread it took 66-69 ms
(docs/benchmarks.md, 2026-12-07, night). This is the effect issue 29 saw as "generate() from
the main thread 5-20x slower than from another thread" under load: it is any two threads.

The worker parses pages in page threads (`engine.page_batch` > 1) and whichever of them finds
the model free runs the shared batch, after the main thread loaded it: two or more pools, the
slow case. So the transformers runtime loads its model here and hands every batch, probe and
timing here (`call`): one pool, whatever thread asks.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar, cast

T = TypeVar("T")


@dataclass
class _Call:
    fn: Callable[[], object]
    done: threading.Event = field(default_factory=threading.Event)
    result: object = None
    error: BaseException | None = None


class ModelThread:
    """A daemon thread that runs the calls handed to it, one at a time, in order.

    Daemon: a worker that exits (or is killed at a deadline) must not wait for a batch in
    progress. A call made from this thread itself runs at once (no deadlock)."""

    def __init__(self, name: str = "model") -> None:
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    @property
    def ident(self) -> int | None:
        """The OS thread's identity (threading.get_ident() inside its calls)."""
        return self._thread.ident

    def call(self, fn: Callable[[], T]) -> T:
        """`fn()` run on the model thread; its result, or its exception raised here."""
        if threading.get_ident() == self._thread.ident:
            return fn()
        if self._closed:
            # Not queued behind the stop: nobody would ever run it, and the caller would wait.
            raise RuntimeError("the model thread has stopped")
        pending = _Call(fn)
        self._calls.put(pending)
        pending.done.wait()
        if pending.error is not None:
            raise pending.error
        return cast(T, pending.result)  # fn's own result: _serve set it

    def close(self) -> None:
        """Stop after the calls already handed over (returns at once); later calls fail."""
        self._closed = True
        self._calls.put(None)

    def _serve(self) -> None:
        while (pending := self._calls.get()) is not None:
            try:
                pending.result = pending.fn()
            except BaseException as exc:  # handed to the caller, whatever it is
                pending.error = exc
            finally:
                pending.done.set()
