"""Fixtures shared by the engine tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from daemon.config.settings import EngineConfig
from daemon.engines.lite.engine import LiteEngine


@pytest.fixture(scope="module")
def lite_engine() -> Iterator[LiteEngine]:
    """One loaded lite engine per test module: loading (its ONNX sessions) is the slow part."""
    eng = LiteEngine(EngineConfig(name="lite", threads=2))
    eng.load()
    yield eng
    eng.close()
