"""While the daemon runs its fallback engine because the MinerU server did not answer, look
at the server again every `engine.http.reprobe_seconds` and say when it is back.

A probe (`GET /health` and `/v1/models`, see `engines.http_runtime.probe_server`) can take
up to its timeout against a host that drops packets, so it runs in a thread: the
supervisor's tick only reads the last answer and never waits on the network.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from daemon.common.errors import EngineUnavailable
from daemon.config.settings import EngineHttpConfig
from daemon.engines.mineru.runtimes.http import ServerProbe, choose_model, probe_server

log = logging.getLogger("docinbox.reprobe")

# probe(settings) -> ServerProbe; tests may pass a different one, the daemon never does.
ProbeFn = Callable[[EngineHttpConfig], ServerProbe]


class Reprobe:
    """Periodic, non-blocking probing of one server. `back(now)` is True once it answers
    with the model we need."""

    def __init__(
        self, settings: EngineHttpConfig, interval: float, probe: ProbeFn = probe_server
    ) -> None:
        self.settings = settings
        self.interval = interval
        self.probe = probe
        self.next_at: float | None = None
        self.last_error: str | None = None
        self._thread: threading.Thread | None = None
        self._ok = threading.Event()

    def _run(self) -> None:
        result = self.probe(self.settings)
        error = result.error if result.reachable else (result.error or "unreachable")
        if error is None:
            try:
                choose_model(self.settings, result)
            except EngineUnavailable as exc:
                error = exc.message
        self.last_error = error
        if error is None:
            self._ok.set()
        else:
            log.info("MinerU server %s still unavailable: %s", result.server, error)

    def back(self, now: float) -> bool:
        """Start a probe when one is due; True when the last one found the server usable."""
        if self._ok.is_set():
            return True
        busy = self._thread is not None and self._thread.is_alive()
        if self.next_at is None:
            self.next_at = now + self.interval  # the load that failed was the first probe
        elif now >= self.next_at and not busy:
            self.next_at = now + self.interval
            self._thread = threading.Thread(target=self._run, name="reprobe", daemon=True)
            self._thread.start()
        return False
