"""What OCR finds on a page that is not text a person would copy: noise lines.

A photo, a ruled area or a smudge gives the detector shapes that the recogniser turns into
strings like "pus re wet rk" or "|||:.-". They are dropped when the recogniser was unsure of
them or when they are mostly symbols; the lite engine counts them in the page info.
"""

from __future__ import annotations

import re

# RapidOCR's own cut-off is 0.5; below it a line is a guess. PP-OCR reads clean print at
# 0.9 and above, so this leaves room for faint or skewed scans.
MIN_CONFIDENCE = 0.5
# Lines made mostly of punctuation and symbols (rules, dotted leaders, bullets, noise).
_MIN_WORD_SHARE = 0.4
# Leaders ("Notices . . . . . vii", "Total ______ 12") are layout, not noise: a run of three
# or more of one punctuation mark is set aside before the share is taken.
_LEADER = re.compile(r"([^\w\s])(?:\s?\1){2,}")


def is_noise(text: str, confidence: float, *, recognised: bool = True) -> bool:
    """True for a line that should not reach the output.

    `recognised=False` (a PDF text layer) only drops empty lines: what the producer wrote
    is text, however many symbols it has.
    """
    visible = [ch for ch in text if not ch.isspace()]
    if not visible:
        return True
    if not recognised:
        return False
    if confidence < MIN_CONFIDENCE:
        return True
    visible = [ch for ch in _LEADER.sub(" ", text) if not ch.isspace()]
    if not visible:
        return True
    word_chars = sum(ch.isalnum() for ch in visible)
    # Short numbers and labels ("7", "(a)", "-1") stay: the share rule needs some length.
    return len(visible) >= 4 and word_chars < _MIN_WORD_SHARE * len(visible)
