"""Engines that misbehave on purpose, loaded by config as `tests.plugins:FaultEngine`.

OCRmyPDF tests its job control with plugins that crash or run out of memory; these do
the same for docinbox's supervisor. Each wraps the REAL `lite` engine, so documents that
get through produce real output; the fault is injected around it, chosen by
`engine.options`:

    fault: crash | segfault | hang | hog | raise | slow | unavailable | gate
    on_page: 0            # 0-based page index that triggers the fault (-1: every page)
    on_load: false        # true: the fault hits while the worker loads the engine instead
                          # (crash|segfault|hang|raise), before its first page or Ready
    times: 1              # how many times in all (counted in files under marker_dir, so
                          # the count survives the worker restarts the fault causes)
    marker_dir: /tmp/x    # required for crash/segfault/hang/hog/raise
    slow_seconds: 2.0     # fault=slow: extra time per page
    hog_mb: 600           # fault=hog: memory to grab and keep
    (fault=gate: every page, once converted, writes `marker_dir/at-gate` and waits until
    `marker_dir/open` exists (at most 120 s) before it is answered, so a test can act
    while the worker holds a page it is done reading: move the inbox away, say)
    pages_in_flight: 1    # declared as max_pages_in_flight: the worker parses that many
                          # lookahead pages at once, from threads
"""

from __future__ import annotations

import ctypes
import os
import time
from pathlib import Path
from typing import Any

from daemon.common.errors import EngineUnavailable
from daemon.config.settings import EngineConfig
from daemon.document.page import EngineInfo, PageInput, PageOptions, PageResult, ProgressFn
from daemon.engines.mineru.engine import MinerUEngine

_HOG: list[bytearray] = []


class FaultEngine:
    name = "fault"

    def __init__(self, config: EngineConfig) -> None:
        from daemon.engines.lite.engine import LiteEngine

        self.opts: dict[str, Any] = dict(config.options)
        self.inner = LiteEngine(config)
        self.max_pages_in_flight = int(self.opts.get("pages_in_flight", 1))

    def load(self) -> EngineInfo:
        fault = self.opts.get("fault")
        if fault == "unavailable":
            raise EngineUnavailable("test engine says its weights are missing", "make weights")
        if fault and self.opts.get("on_load") and self._count_fault(-1):
            self._inject(str(fault))  # as a native library's import that segfaults would
        info = self.inner.load()
        return EngineInfo(name="fault", model_id=info.model_id, details={"wraps": "lite"})

    def _should_fault(self, page_idx: int) -> bool:
        on = int(self.opts.get("on_page", 0))
        if self.opts.get("on_load") or on not in (-1, page_idx):
            return False
        return self._count_fault(page_idx)

    def _count_fault(self, page_idx: int) -> bool:
        """Whether this fault is still due (`times`), counting it under marker_dir."""
        marker = Path(str(self.opts.get("marker_dir", "/nonexistent")))
        if not marker.is_dir():
            return True
        done = len(list(marker.glob("fault-*")))
        if done >= int(self.opts.get("times", 1)):
            return False
        (marker / f"fault-{done}-{os.getpid()}").write_text(str(page_idx))
        return True

    def parse_page(self, page: PageInput, options: PageOptions, progress: ProgressFn) -> PageResult:
        fault = self.opts.get("fault")
        if fault == "slow":
            time.sleep(float(self.opts.get("slow_seconds", 1.0)))
        elif fault and self._should_fault(page.page_idx):
            self._inject(str(fault))
        result = self.inner.parse_page(page, options, progress)
        if fault == "gate":
            self._wait_at_gate(Path(str(self.opts["marker_dir"])))
        return result

    def _wait_at_gate(self, marker: Path) -> None:
        (marker / "at-gate").write_text(str(os.getpid()))
        end = time.monotonic() + 120
        while not (marker / "open").exists() and time.monotonic() < end:
            time.sleep(0.02)

    def _inject(self, fault: str) -> None:
        if fault == "crash":
            os._exit(77)
        if fault == "segfault":
            ctypes.string_at(0)  # a real SIGSEGV
        if fault == "hang":
            time.sleep(3600)
        if fault == "hog":
            _HOG.append(bytearray(int(self.opts.get("hog_mb", 600)) * 1024 * 1024))
            for i in range(0, len(_HOG[-1]), 4096):  # touch the pages so RSS grows
                _HOG[-1][i] = 1
        if fault == "raise":
            raise RuntimeError("the test engine broke on purpose")

    def close(self) -> None:
        self.inner.close()


class FigureEngine:
    """The REAL `lite` engine plus one picture block per page, the way the `mineru`
    engine reports a figure (type and box, nothing else): what reaches the outbox then
    shows the worker's crop step, the page store and the outbox writer working together,
    without a model. `engine.options.figure_bbox` places the figure (0..1 of the page)."""

    name = "figure"

    def __init__(self, config: EngineConfig) -> None:
        from daemon.engines.lite.engine import LiteEngine

        box = config.options.get("figure_bbox")
        x0, y0, x1, y1 = box if isinstance(box, list) and len(box) == 4 else (0.1, 0.5, 0.6, 0.9)
        self.bbox = (float(x0), float(y0), float(x1), float(y1))
        self.inner = LiteEngine(config)

    def load(self) -> EngineInfo:
        info = self.inner.load()
        return EngineInfo(name="figure", model_id=info.model_id, details={"wraps": "lite"})

    def parse_page(self, page: PageInput, options: PageOptions, progress: ProgressFn) -> PageResult:
        import dataclasses

        from daemon.document.page import Block

        result = self.inner.parse_page(page, options, progress)
        figure = Block("image", self.bbox, text="a test picture", sub_type="natural_image",
                       index=len(result.blocks))
        return dataclasses.replace(result, blocks=[*result.blocks, figure])

    def close(self) -> None:
        self.inner.close()


class RandomReaderMinerU(MinerUEngine):
    """The real `mineru` engine on the tiny model, made to read at random (fixed seed) by
    `tests.tinymodel.make_random_reader`, so a worker process gives page-dependent output
    that batching could disturb."""

    def load(self) -> EngineInfo:
        from tests.tinymodel import make_random_reader

        info = super().load()
        make_random_reader(self)
        return info
