"""Which engine the worker runs: the configured one, or the fallback while it cannot.

The supervisor owns the worker's life; this owns the decision that the next worker runs a
different engine, and back. When the configured engine cannot run (weights missing, a
MinerU server that does not answer), `engine.fallback_engine` stands in and documents are
marked with the engine that did them. When the configured engine is an http server, it is
looked at again every `engine.http.reprobe_seconds` (off the main loop, see
`daemon.supervisor.reprobe`), and the next document boundary switches back.
"""

from __future__ import annotations

import logging

from daemon.config.settings import EngineConfig
from daemon.engines.mineru.runtimes.http import display_url
from daemon.supervisor.reprobe import Reprobe

log = logging.getLogger("docinbox.supervisor")


class EngineChoice:
    """The engine the next worker loads, why it is not the configured one, and how often
    it changed (switches are planned, never counted as restarts)."""

    def __init__(self, configured: EngineConfig) -> None:
        self.configured = configured
        self.name = configured.name
        self.fallback_reason: str | None = None
        self.switches = 0
        # Set while the fallback stands in for an unreachable MinerU server.
        self.reprobe: Reprobe | None = None

    def reconfigure(self, configured: EngineConfig) -> None:
        """SIGHUP changed the engine section: start again from the configured engine."""
        self.configured = configured
        self.name = configured.name
        self.fallback_reason = None
        self.reprobe = None

    def fall_back(self, now: float, message: str, hint: str) -> bool:
        """The current engine cannot run. Switch to the fallback and say so loudly; False
        when there is no fallback to switch to (the caller gives up)."""
        fb = self.configured.fallback_engine
        if not fb or self.name == fb:
            return False
        self.fallback_reason = f"engine {self.name!r} unavailable: {message}"
        primary = self.configured
        if self.name == primary.name and primary.runtime == "http":
            self.reprobe = Reprobe(primary.http, primary.http.reprobe_seconds)
            self.reprobe.back(now)
        log.warning(
            "engine %r cannot run: %s. FALLING BACK to %r; documents are marked with the "
            "engine used, so you can `docinbox reprocess` them later.%s",
            self.name,
            message,
            fb,
            f" To fix: {hint}" if hint else "",
        )
        self.name = fb
        self.switches += 1
        return True

    def server_back(self, now: float) -> bool:
        """True once the MinerU server the fallback stands in for answers again."""
        return self.reprobe is not None and self.reprobe.back(now)

    def switch_back(self) -> str:
        """Back to the configured engine (the caller replaces the worker); its name."""
        assert self.reprobe is not None
        primary = self.configured.name
        log.warning(
            "MinerU server %s answers again: SWITCHING BACK from %r to %r",
            display_url(self.reprobe.settings.server_url),
            self.name,
            primary,
        )
        self.name = primary
        self.fallback_reason = None
        self.reprobe = None
        self.switches += 1
        return primary
