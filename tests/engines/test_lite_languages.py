"""`engine.ocr_languages` went: it was declared but never read, and the rapidocr wheel ships
one recognition model, so a config that still sets it is told why instead of being obeyed
in silence."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.config.settings import Config, ConfigError, load_config


def _config(tmp_path: Path, engine: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(f"inboxes: [./inbox]\noutbox: ./outbox\nengine:\n{engine}", encoding="utf-8")
    return path


@pytest.mark.parametrize("value", ["[]", "[en]", "[de, fr]"])
def test_ocr_languages_is_refused_with_the_reason(tmp_path: Path, value: str) -> None:
    path = _config(tmp_path, f"  name: lite\n  ocr_languages: {value}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    (problem,) = err.value.problems
    assert problem.key == "engine.ocr_languages"
    assert "removed" in problem.message
    assert "delete the line" in problem.hint
    assert "PP-OCRv6" in problem.hint


def test_the_engine_section_no_longer_declares_it(tmp_path: Path) -> None:
    cfg = load_config(_config(tmp_path, "  name: lite\n"))
    assert isinstance(cfg, Config)
    assert not hasattr(cfg.engine, "ocr_languages")


def test_the_named_model_is_the_one_the_wheel_ships() -> None:
    # The hint names the recogniser; if a rapidocr upgrade ships another, the hint is stale.
    from daemon.engines.lite.ocr import bundled_models

    rapidocr = pytest.importorskip("rapidocr")
    models = bundled_models(Path(rapidocr.__file__).parent / "models")
    assert "PP-OCRv6_rec" in models["rec"].name
    assert len(list(models["rec"].parent.glob("*rec*.onnx"))) == 1
