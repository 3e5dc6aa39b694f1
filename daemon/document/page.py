"""The page contract: what an engine is given for one page and what it hands back.

Every module on the data path (worker, engines, supervisor, store, output) speaks these
types, so this module imports nothing heavy: the daemon process loads it to read page
results and must never load Pillow or torch (a test checks `sys.modules`). The page image
is typed only for the type checker; the worker and the engines are the ones holding pixels.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from daemon.common.errors import DocumentError

if TYPE_CHECKING:
    from PIL import Image

# A JSON value, as json.loads hands it back. The engines' free-form facts (page info,
# engine details) and the model's raw answers are this: they are stored as JSON and
# written to meta.json and <stem>_model.json as they are.
Json = str | int | float | bool | None | list["Json"] | dict[str, "Json"]

# MinerU's block vocabulary (mineru_vl_utils.structs.BlockType); engines emit these names so
# that the output formats can render them the way MinerU's own renderers do.
TEXT = "text"
TITLE = "title"
IMAGE = "image"
IMAGE_CAPTION = "image_caption"
IMAGE_FOOTNOTE = "image_footnote"
TABLE = "table"
TABLE_CAPTION = "table_caption"
TABLE_FOOTNOTE = "table_footnote"
CHART = "chart"
CHART_CAPTION = "chart_caption"
CHART_FOOTNOTE = "chart_footnote"
EQUATION = "equation"  # interline (display) equation
CODE = "code"
CODE_CAPTION = "code_caption"
ALGORITHM = "algorithm"
LIST = "list"
LIST_ITEM = "list_item"
REF_TEXT = "ref_text"
HEADER = "header"
FOOTER = "footer"
PAGE_NUMBER = "page_number"
ASIDE_TEXT = "aside_text"
PAGE_FOOTNOTE = "page_footnote"
PHONETIC = "phonetic"

# Blocks the worker cuts a JPEG crop for (MinerU does the same), and the crop's file name.
CROPPED_TYPES = frozenset({IMAGE, TABLE, CHART, EQUATION})


def crop_name(page_idx: int, block_type: str, index: int) -> str:
    """MinerU's name for a block's crop: `page_<page_idx>_<type>_<index>.jpg`."""
    return f"page_{page_idx}_{block_type}_{index}.jpg"


# Where a block's content came from; recorded in meta.json so a user can tell.
SOURCE_TEXT_LAYER = "text_layer"
SOURCE_OCR = "ocr"
SOURCE_MODEL = "model"


@dataclass(frozen=True)
class Block:
    """One layout block of a page, in reading order, in MinerU's block vocabulary.

    Engines emit blocks flat, captions and footnotes as blocks of their own right after or
    before their figure, list items as `text` blocks inside a `list` box, the way
    mineru-vl-utils hands them over; the output formats group them as MinerU's renderers do.

    bbox is (x0, y0, x1, y1) normalised to 0..1 of the page width/height, so it does not
    depend on the render DPI. content_list.json scales it to MinerU's 0..1000 ints.
    """

    type: str
    bbox: tuple[float, float, float, float]
    text: str = ""
    # Heading depth for titles: 1 = document title, 2 = section, ...; 0 = not known (the
    # output decides as MinerU does) or body text.
    text_level: int = 0
    html: str | None = None  # tables
    latex: str | None = None  # equations
    angle: int | None = None  # 0/90/180/270 when the engine detected rotated content
    source: str = SOURCE_MODEL
    # What the model said the picture is ("natural_image", "bar_chart", ...) and, in
    # `text`, its description (images) or its data as a Markdown table (charts).
    sub_type: str | None = None
    # Position of the block in the engine's own layout answer for this page. MinerU names
    # crops after it (images/page_<page_idx>_<type>_<index>.jpg); None = position in page.
    index: int | None = None
    continues_prev: bool = False  # a paragraph continued after a column or page break


@dataclass(frozen=True)
class Crop:
    """A JPEG cut from the rendered page for one image, table, chart or equation block.

    Cut by the worker after the engine answered (the daemon never holds pixels), stored
    with the page so a resumed document keeps it, written to `images/<name>`.
    """

    name: str  # page_<page_idx>_<type>_<index>.jpg, as MinerU names it
    jpeg: bytes
    size: tuple[int, int]  # pixels (width, height)


@dataclass(frozen=True)
class TextLine:
    """One line (or one horizontally separate piece of a line) of a PDF's text layer.

    bbox is (x0, y0, x1, y1) in 0..1 of the displayed page (page rotation applied), origin
    top-left, like `Block.bbox`. font_size is the median effective size in points.
    """

    text: str
    bbox: tuple[float, float, float, float]
    font_size: float | None = None
    invisible: bool = False  # drawn with text render mode 3: an OCR layer over a scan
    unmapped: int = 0  # characters PDFium could not map to Unicode (garbled on extraction)
    bold: bool = False  # most characters are in a bold font (weight or font name says so)
    # Each word of an upright line with its horizontal extent (x0, x1) in 0..1, so a line
    # that runs across two layout boxes (a page number and a footer on one baseline) can
    # be shared between them. Empty for rotated lines: then the line counts as a whole.
    words: tuple[tuple[str, float, float], ...] = ()


@dataclass(frozen=True)
class PageText:
    """A PDF page's own text layer, read once for the engine (`textlayer.with_text_layer`)."""

    lines: tuple[TextLine, ...] = ()
    # Why it could not be read (a broken content stream on a page that rendered fine): an
    # engine may look at the pixels instead, or fail the page with it.
    error: DocumentError | None = None

    def checked(self) -> tuple[TextLine, ...]:
        """The lines; raises the error the layer could not be read with."""
        if self.error is not None:
            raise self.error
        return self.lines


@dataclass(frozen=True)
class PageInput:
    """One rendered page plus what an engine may want beyond pixels."""

    image: Image.Image  # RGB, rendered at `dpi` (or the image file's own pixels)
    page_idx: int  # 0-based
    page_count: int
    dpi: int | None  # None for image inputs
    pdf_path: Path | None = None  # set for PDF pages: engines may read the text layer
    # The password that opened the PDF; repr=False keeps it out of logs and tracebacks.
    pdf_password: str | None = field(default=None, repr=False)
    page_size_pt: tuple[float, float] | None = None  # PDF page size in points
    # The PDF's own text layer, when `engine.text_layer` is auto and the page is a PDF's;
    # None otherwise (engines then read the pixels only). Engines read it from here only.
    text_layer: PageText | None = None


# `engine.text_layer`: a born-digital PDF's own text inside layout boxes, or the model only.
TextLayer = Literal["auto", "off"]


@dataclass(frozen=True)
class PageOptions:
    """Everything that decides how one page is rendered and read, complete.

    Built once per document from the engine config with the inbox's `engine_options` laid
    over it (`config.page_options_for`); it travels to the worker as it is.
    """

    # The defaults of the page keys: config's `engine` section takes its defaults from here.
    text_layer: TextLayer = "auto"
    dpi: int = 200
    max_long_side: int = 4000
    max_new_tokens_layout: int = 1536
    max_new_tokens_block: int = 1024
    # The document's page selection ("1-3,7"); the supervisor reads it, engines ignore it.
    pages: str | None = None


@dataclass(frozen=True)
class PageResult:
    blocks: list[Block]
    # Free-form facts for meta.json, e.g. {"text_layer_blocks": 12, "model_blocks": 3}.
    info: dict[str, Json] = field(default_factory=dict)
    # The model's raw answers for this page (layout string, each block request and answer),
    # written to <stem>_model.json so post-processing can be re-run without the model.
    model_output: dict[str, Json] | None = None
    crops: tuple[Crop, ...] = ()  # filled by the worker, never by engines


@dataclass(frozen=True)
class EngineInfo:
    name: str
    model_id: str | None = None
    revision: str | None = None
    precision: str | None = None
    details: dict[str, Json] = field(default_factory=dict)


# progress(done, total, what): e.g. progress(3, 17, "block") while recognising block 3 of 17.
ProgressFn = Callable[[int, int, str], None]


class Engine(Protocol):
    """What the worker drives. Lives in the worker process only.

    An engine may also declare `max_pages_in_flight: int` (read with `pages_in_flight`;
    1 when absent). Above 1 the worker calls `parse_page` for several lookahead pages at
    once from threads, so the engine's `parse_page` must then be thread-safe; each such
    thread renders its page and parses it inside the engine's optional `coming_page()`
    context (see `coming_page` below).
    """

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


def coming_page(engine: object) -> AbstractContextManager[None]:
    """Around rendering a page and parsing it ahead: an engine that batches pages (its
    optional `coming_page()`) then waits for the page rather than starting without it."""
    coming = getattr(engine, "coming_page", None)
    return coming() if callable(coming) else nullcontext()


def pages_in_flight(engine: object) -> int:
    """How many pages `engine` may parse at once: its `max_pages_in_flight`, else 1."""
    value = getattr(engine, "max_pages_in_flight", 1)
    return value if isinstance(value, int) and value > 1 else 1


def no_progress(done: int, total: int, what: str) -> None:
    return None
