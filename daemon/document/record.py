"""A finished page as the daemon keeps it: one typed record from the worker's answer to
the rendered files.

The worker answers a page with its blocks, facts, crops and the model's raw answers
(`daemon.document.protocol.PageDone`); the supervisor makes one `PageRecord` of it with the
engine that did the page, the store keeps that record and hands the same type back, and
the output formats render from it. Nothing on the way is a loose dict.

The store keeps the blocks as ONE serialised value, written and read here, next to the
dataclasses, so the store needs to know nothing of a block's fields:

    {"version": 1, "blocks": [{"type": ..., "bbox": [x0, y0, x1, y1], ...}, ...]}

Version 0 is what docinbox wrote before the version field existed: a bare JSON list of
the same block objects. A database from that release still holds such rows (its pages
resume, its documents publish), so both are read. Keys a version no longer has (the
engine-made Markdown "md" of an older release) are dropped; an unknown version is refused
rather than guessed at.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from daemon.document.page import Block, Crop, Json

BLOCKS_VERSION = 1


@dataclass(frozen=True)
class PageRecord:
    """One finished page: what the store keeps and the formats render from."""

    page_idx: int  # 0-based, in the document
    blocks: tuple[Block, ...]  # in reading order
    engine: str  # the engine that did this page (a fallback may have done some pages)
    seconds: float  # from the request to the answer
    # Free-form facts for meta.json (sizes, text layer, timings), as the engine and the
    # worker reported them.
    info: Mapping[str, Json] = field(default_factory=dict)
    # The model's raw answers, for <stem>_model.json; None for engines without a model.
    model_output: Mapping[str, Json] | None = None
    crops: tuple[Crop, ...] = ()  # JPEGs of the page's figures, written to images/

    @property
    def size_pt(self) -> tuple[float, float] | None:
        """The PDF page's size in points, when the worker measured one."""
        size = self.info.get("page_size_pt")
        if isinstance(size, list | tuple) and len(size) == 2:
            w, h = size
            if isinstance(w, int | float) and isinstance(h, int | float):
                return (float(w), float(h))
        return None


class StoredBlocksError(ValueError):
    """A page's stored blocks are in a shape this docinbox does not know."""


def encode_blocks(blocks: Sequence[Block]) -> str:
    """A page's blocks as the one JSON value the store keeps."""
    return json.dumps({"version": BLOCKS_VERSION, "blocks": [_block_json(b) for b in blocks]})


def decode_blocks(text: str) -> tuple[Block, ...]:
    """The blocks `encode_blocks` wrote, or a version 0 row (a bare list) of an older
    docinbox. Raises StoredBlocksError for anything else."""
    raw = json.loads(text)
    items: object
    if isinstance(raw, list):
        items = raw  # version 0
    elif isinstance(raw, dict) and raw.get("version") == BLOCKS_VERSION:
        items = raw.get("blocks")
    else:
        version = raw.get("version") if isinstance(raw, dict) else type(raw).__name__
        raise StoredBlocksError(f"stored blocks of unknown version {version!r}")
    if not isinstance(items, list) or not all(isinstance(d, dict) for d in items):
        raise StoredBlocksError("stored blocks are not a list of objects")
    return tuple(_block(d) for d in items)


def _block_json(block: Block) -> dict[str, Any]:
    d = asdict(block)
    d["bbox"] = list(block.bbox)
    return d


_FIELDS = frozenset(f.name for f in fields(Block))


def _block(d: dict[str, Any]) -> Block:
    kept = {k: v for k, v in d.items() if k in _FIELDS}
    kept["bbox"] = tuple(kept["bbox"])
    return Block(**kept)
