"""Fixtures shared by the engine tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.config.settings import EngineConfig
from daemon.engines.lite.engine import LiteEngine
from tests.tinymodel import tiny_model_once


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny MinerU2.5-shaped checkpoint per test session (a few seconds to build)."""
    return tiny_model_once(tmp_path_factory.mktemp("tiny-mineru"))


@pytest.fixture(scope="module")
def lite_engine() -> Iterator[LiteEngine]:
    """One loaded lite engine per test module: loading (its ONNX sessions) is the slow part."""
    eng = LiteEngine(EngineConfig(name="lite", threads=2))
    eng.load()
    yield eng
    eng.close()
