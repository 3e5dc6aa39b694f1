"""Engines turn one page image into blocks. Chosen by name in config.

Built-in names: `mineru` (MinerU2.5 on torch), `lite` (PDF text layer + RapidOCR).
`package.module:ClassName` loads any other class with the `Engine` shape; the test suite
uses this for engines that crash or hog memory on purpose (OCRmyPDF-style test plugins).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from daemon.config.settings import BUILTIN_ENGINES

if TYPE_CHECKING:
    from daemon.config.settings import EngineConfig
    from daemon.document.page import Engine

BUILTIN = BUILTIN_ENGINES


def create_engine(name: str, config: EngineConfig) -> Engine:
    """Instantiate (but do not load) the engine called `name`.

    Imports are deferred so that the daemon process, which only validates names, never
    pulls in torch or onnxruntime.
    """
    cls: Any
    if name == "lite":
        from daemon.engines.lite.engine import LiteEngine

        cls = LiteEngine
    elif name == "mineru":
        from daemon.engines.mineru.engine import MinerUEngine

        cls = MinerUEngine
    elif ":" in name:
        module_name, _, attr = name.partition(":")
        cls = getattr(importlib.import_module(module_name), attr)
    else:
        raise ValueError(f"unknown engine {name!r} (built-in: {', '.join(BUILTIN)})")
    engine: Engine = cls(config)
    return engine
