"""What OCR finds on a page that is not text a person would copy: noise lines.

A photo, a ruled area or a smudge gives the detector shapes that the recogniser turns into
strings like "pus re wet rk" or "|||:.-". They are dropped when the recogniser was unsure of
them or when they are mostly symbols; the lite engine counts them in the page info.
"""

from __future__ import annotations

# RapidOCR's own cut-off is 0.5; below it a line is a guess. PP-OCR reads clean print at
# 0.9 and above, so this leaves room for faint or skewed scans.
MIN_CONFIDENCE = 0.5
# Lines made mostly of punctuation and symbols (rules, dotted leaders, bullets, noise).
_MIN_WORD_SHARE = 0.4


def is_noise(text: str, confidence: float) -> bool:
    """True for a line that should not reach the output."""
    visible = [ch for ch in text if not ch.isspace()]
    if not visible:
        return True
    if confidence < MIN_CONFIDENCE:
        return True
    word_chars = sum(ch.isalnum() for ch in visible)
    # Short numbers and labels ("7", "(a)", "-1") stay: the share rule needs some length.
    return len(visible) >= 3 and word_chars < _MIN_WORD_SHARE * len(visible)
