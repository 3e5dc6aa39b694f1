"""The engine interface: load once, then parse one page image at a time into blocks.

An engine lives inside the worker process only. The daemon never imports torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from PIL import Image

# MinerU's block vocabulary (mineru_vl_utils.structs.BlockType); engines use these names so
# that content_list.json reads like MinerU's own output.
TEXT = "text"
TITLE = "title"
TABLE = "table"
IMAGE = "image"
EQUATION = "equation"
LIST = "list"
CODE = "code"
HEADER = "header"
FOOTER = "footer"
PAGE_NUMBER = "page_number"

# Where a block's content came from; recorded in meta.json so a user can tell.
SOURCE_TEXT_LAYER = "text_layer"
SOURCE_OCR = "ocr"
SOURCE_MODEL = "model"


@dataclass
class Block:
    """One layout block of a page, in reading order.

    bbox is (x0, y0, x1, y1) normalised to 0..1 of the page width/height, so it does not
    depend on the render DPI. content_list.json scales it to MinerU's 0..1000 ints.
    """

    type: str
    bbox: tuple[float, float, float, float]
    text: str = ""
    text_level: int = 0  # 1 = top heading, 2 = sub-heading, ...; 0 = body
    html: str | None = None  # tables
    latex: str | None = None  # equations
    angle: int | None = None  # 0/90/180/270 when the engine detected rotated content
    source: str = SOURCE_MODEL
    md: str | None = None  # Markdown the engine assembled itself; output uses it verbatim

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["bbox"] = list(self.bbox)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Block:
        d = dict(d)
        d["bbox"] = tuple(d["bbox"])
        return cls(**d)


@dataclass
class PageInput:
    """One rendered page plus what an engine may want beyond pixels."""

    image: Image.Image  # RGB, rendered at `dpi` (or the image file's own pixels)
    page_idx: int  # 0-based
    page_count: int
    dpi: int | None  # None for image inputs
    pdf_path: Path | None = None  # set for PDF pages: engines may read the text layer
    pdf_password: str | None = None  # the password that opened the PDF, never logged
    page_size_pt: tuple[float, float] | None = None  # PDF page size in points


@dataclass
class PageOptions:
    """Per-page knobs. Inboxes may override these (config `inboxes[].engine_options`)."""

    text_layer: str = "auto"  # auto | off
    max_new_tokens_layout: int = 1536
    max_new_tokens_block: int = 1024
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class PageResult:
    blocks: list[Block]
    # Free-form facts for meta.json, e.g. {"text_layer_blocks": 12, "model_blocks": 3}.
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class EngineInfo:
    name: str
    model_id: str | None = None
    revision: str | None = None
    precision: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


# progress(done, total, what): e.g. progress(3, 17, "block") while recognising block 3 of 17.
ProgressFn = Callable[[int, int, str], None]


class Engine(Protocol):
    name: str

    def load(self) -> EngineInfo:
        """Load models once. Raises errors.EngineUnavailable when it cannot run here."""
        ...

    def parse_page(
        self, page: PageInput, options: PageOptions, progress: ProgressFn
    ) -> PageResult:
        """Parse one page. Raises errors.DocumentError for problems with the input."""
        ...

    def close(self) -> None: ...


def no_progress(done: int, total: int, what: str) -> None:
    return None
