"""`<stem>_model.json`: the model's raw answers per page.

For each page: the layout prompt and the model's raw layout string, every block request
(its index in the layout answer, type, prompt) with the raw answer, and the blocks whose
text came from the PDF's text layer instead. With this file, MinerU's post-processing can
be re-run (or replaced) without running the model again. Engines without a model (lite)
have no answers to record: their pages list only `page_idx` and `engine`.
"""

from __future__ import annotations

from collections.abc import Sequence

from daemon.document.page import Json
from daemon.document.record import PageRecord


def model_json(pages: Sequence[PageRecord]) -> list[dict[str, Json]]:
    """From the stored pages (`Store.pages`), in page order."""
    return [
        {"page_idx": p.page_idx, "engine": p.engine, **(p.model_output or {})}
        for p in pages
    ]
