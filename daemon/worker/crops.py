"""Crops of figures, tables, charts and equations, cut in the worker from the rendered page.

MinerU writes a JPEG of every image, table, chart and interline equation block, cut from
the page it rendered, and names it `page_<page_idx>_<type>_<index>.jpg`; multimodal RAG
pipelines open those files to embed the figure. The worker is the one process holding the
page's pixels, so it cuts them here, right after the engine answered; the crops then
travel with the page result and are stored with the page (a resumed document keeps them).
"""

from __future__ import annotations

import dataclasses
import io
import math
from typing import TYPE_CHECKING

from daemon.document.page import (
    CROPPED_TYPES,
    SOURCE_OCR,
    Block,
    Crop,
    PageInput,
    PageResult,
    crop_name,
)

if TYPE_CHECKING:
    from PIL import Image

# MinerU's own JPEG setting for its crops; high enough that a table stays legible.
JPEG_QUALITY = 95


def cut(image: Image.Image, block: Block) -> Image.Image | None:
    """The block's box on `image`, rounded outwards to whole pixels as MinerU does.

    A block that OCR read on a scan it had to turn (`angle`: the counter-clockwise turn
    that made the page upright) is turned the same way, so a figure on a sideways scan
    comes out upright, as a person looks at it, not as the scanner stored it.
    """
    width, height = image.size
    x0, y0, x1, y1 = block.bbox
    box = (
        max(0, math.floor(x0 * width)),
        max(0, math.floor(y0 * height)),
        min(width, math.ceil(x1 * width)),
        min(height, math.ceil(y1 * height)),
    )
    if box[2] <= box[0] or box[3] <= box[1]:
        return None
    piece = image.crop(box)
    if block.source == SOURCE_OCR and block.angle and block.angle % 360:
        piece = piece.rotate(block.angle % 360, expand=True)
    return piece


def page_crops(page: PageInput, blocks: list[Block]) -> tuple[Crop, ...]:
    crops: list[Crop] = []
    seen: set[str] = set()
    for position, block in enumerate(blocks):
        if block.type not in CROPPED_TYPES:
            continue
        index = block.index if block.index is not None else position
        name = crop_name(page.page_idx, block.type, index)
        piece = cut(page.image, block)
        if piece is None or name in seen:
            continue
        seen.add(name)
        buffer = io.BytesIO()
        piece.convert("RGB").save(buffer, "JPEG", quality=JPEG_QUALITY)
        crops.append(Crop(name=name, jpeg=buffer.getvalue(), size=piece.size))
    return tuple(crops)


def finish_page(page: PageInput, result: PageResult) -> PageResult:
    """The engine's result with the page's crops and its size in PDF points added."""
    info = dict(result.info)
    if page.page_size_pt is not None:
        info.setdefault("page_size_pt", list(page.page_size_pt))
    return dataclasses.replace(result, info=info, crops=page_crops(page, result.blocks))
