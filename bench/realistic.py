"""The work of a real page, for benchmarks with random weights (`bench_mineru.py --realistic`).

Random weights stop at random places, so the benchmark forces how much each step generates.
Here those amounts come from a real corpus page instead of round numbers:

- blocks: the page's PDF text layer grouped into paragraphs, headings, captions, figure
  regions and the page number, each on its real region (MinerU's 0..1000 boxes);
- layout step: forced to the token count of the layout string MinerU2.5 writes for exactly
  these blocks (`<|box_start|>x0 y0 x1 y1<|box_end|><|ref_start|>type<|ref_end|><|rotate_up|>`
  per block, one line each);
- each block: forced to the token count of its real text, plus the end-of-turn token.

Token counts use Qwen2's own BPE vocabulary (MinerU2.5's tokenizer), read from the
`qwen.tiktoken` rank file that the `dashscope` wheel on PyPI ships (bench-only, fetched with
pip, never a runtime dependency), with Qwen2's pre-tokenizer rule (digits one by one). Where
that cannot be fetched, the bench model's own tokenizer counts instead (a small offline BPE:
more tokens per word than Qwen2's); the results record which one counted.
"""

from __future__ import annotations

import base64
import json
import os
import statistics
import subprocess
import sys
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# The shared corpus next to the checkout; DOCINBOX_CORPUS names it from elsewhere (a
# second worktree).
CORPUS = Path(os.environ.get("DOCINBOX_CORPUS") or REPO.parent / "shared" / "corpus") / "pdf"
# Two columns, headings, paragraphs, two figures with captions, page number: 20 blocks.
DEFAULT_PAGE = (CORPUS / "docling__amt_handbook_sample.pdf", 0)
# Four pages of a two-column report with tables (14-37 blocks, 750-1,200 block tokens per
# page), for the page pipeline: idle time between pages, model busy share.
DEFAULT_DOCUMENT = CORPUS / "docling__normal_4pages.pdf"
# Twelve pages of an IBM Redbook (docling__redp5110_sampled.pdf, 18 pages): title page,
# contents, prose, lists, a table; for batching several pages' model steps (issue 21).
LONG_DOCUMENT_SOURCE = CORPUS / "docling__redp5110_sampled.pdf"
LONG_DOCUMENT_PAGES = 12
DASHSCOPE = "dashscope==2.0.2"
RANK_FILE = "dashscope/resources/qwen.tiktoken"
# Qwen2's pre-tokenizer: contractions, letters, ONE digit at a time, punctuation runs,
# newlines, spaces (tokenizer.json of Qwen2 / MinerU2.5).
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL = r"<\|[a-z_]+\|>"


@dataclass(frozen=True)
class PlanBlock:
    type: str
    bbox: tuple[int, int, int, int]  # MinerU's 0..1000 page coordinates
    text: str
    tokens: int  # what the model writes for it: its text + end-of-turn


@dataclass(frozen=True)
class PagePlan:
    pdf: str
    page_idx: int
    blocks: tuple[PlanBlock, ...]
    layout: str
    layout_tokens: int
    counted_with: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class QwenCounter:
    """Token counts with Qwen2's BPE ranks (byte-level BPE, lowest-rank merge first)."""

    def __init__(self, ranks: dict[bytes, int]) -> None:
        import regex

        self.ranks = ranks
        self.pattern = regex.compile(QWEN_PATTERN)
        self.special = regex.compile(SPECIAL)
        self.name = "qwen2-bpe"

    def _piece(self, piece: bytes) -> list[bytes]:
        parts = [piece[i : i + 1] for i in range(len(piece))]
        while len(parts) > 1:
            best: tuple[int, int] | None = None
            for i in range(len(parts) - 1):
                rank = self.ranks.get(parts[i] + parts[i + 1])
                if rank is not None and (best is None or rank < best[0]):
                    best = (rank, i)
            if best is None:
                break
            i = best[1]
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        return parts

    def tokens(self, text: str) -> list[bytes]:
        """The text's tokens, each as its bytes (a special token as its name)."""
        out: list[bytes] = []
        pos = 0
        for match in [*self.special.finditer(text), None]:
            end = match.start() if match else len(text)
            for word in self.pattern.findall(text[pos:end]):
                out += self._piece(word.encode("utf-8"))
            if match:
                out.append(match.group().encode())  # a special token is one id
                pos = match.end()
        return out

    def count(self, text: str) -> int:
        return len(self.tokens(text))


class ModelCounter:
    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.name = f"bench model tokenizer ({model_dir.name})"

    def count(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])


def qwen_ranks(cache: Path) -> dict[bytes, int] | None:
    """Qwen's BPE ranks from the dashscope wheel (pip download, once); None if unavailable."""
    target = cache / "qwen.tiktoken"
    if not target.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", DASHSCOPE]
        done = subprocess.run(
            [*pip, "-d", str(cache)],
            check=False,
        )
        wheels = sorted(cache.glob("dashscope-*.whl"))
        if done.returncode != 0 or not wheels:
            return None
        with zipfile.ZipFile(wheels[0]) as wheel:
            target.write_bytes(wheel.read(RANK_FILE))
    ranks: dict[bytes, int] = {}
    for line in target.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def counter(model_dir: Path, cache: Path) -> QwenCounter | ModelCounter:
    ranks = qwen_ranks(cache)
    return QwenCounter(ranks) if ranks else ModelCounter(model_dir)


def _box(bbox: tuple[float, float, float, float]) -> tuple[int, int, int, int]:
    x0, y0, x1, y1 = (min(1000, max(0, round(v * 1000))) for v in bbox)
    return x0, y0, x1, y1


def _union(boxes: list[tuple[float, float, float, float]]) -> tuple[float, float, float, float]:
    return (
        min(b[0] for b in boxes),
        min(b[1] for b in boxes),
        max(b[2] for b in boxes),
        max(b[3] for b in boxes),
    )


def group_blocks(lines: list[Any]) -> list[tuple[str, tuple[float, float, float, float], str]]:
    """Text-layer lines -> (type, bbox 0..1, text) blocks, the way a layout model sees them.

    Paragraphs: consecutive lines in the text layer's order whose vertical gap is under half a
    line and which overlap horizontally. Lines set smaller than the body inside a figure are
    figure labels: they become one `image` block per column. A short single line before a
    paragraph is a `title`, "Figure ..." an `image_caption`, a number at the foot the
    `page_number`.
    """
    sizes = [ln.font_size for ln in lines if ln.font_size]
    body = statistics.median(sizes) if sizes else 10.0
    labels = [ln for ln in lines if ln.font_size and ln.font_size < 0.85 * body]
    # Visual lines: pieces of one baseline that touch (a fraction set as two text runs).
    visual: list[list[Any]] = []
    for line in (ln for ln in lines if ln not in labels):
        if visual:
            prev = visual[-1][-1]
            height = prev.bbox[3] - prev.bbox[1]
            touching = -0.01 < line.bbox[0] - prev.bbox[2] < 0.02
            if abs(line.bbox[1] - prev.bbox[1]) < 0.3 * height and touching:
                visual[-1].append(line)
                continue
        visual.append([line])
    spans = [_union([ln.bbox for ln in v]) for v in visual]

    def half(box: tuple[float, float, float, float]) -> int:
        return int((box[0] + box[2]) / 2 >= 0.5)

    widths = {
        h: statistics.median([b[2] - b[0] for b in spans if half(b) == h] or [1.0]) for h in (0, 1)
    }
    groups: list[list[int]] = []
    for i, box in enumerate(spans):
        if groups:
            prev = spans[groups[-1][-1]]
            height = prev[3] - prev[1]
            gap = box[1] - prev[3]
            overlap = min(box[2], prev[2]) - max(box[0], prev[0])
            # A short line ends a paragraph (or is a heading on its own).
            short = prev[2] - prev[0] < 0.8 * widths[half(prev)]
            if -0.5 * height < gap < 0.5 * height and overlap > 0 and not short:
                groups[-1].append(i)
                continue
        groups.append([i])
    merged: list[list[Any]] = [[ln for i in g for ln in visual[i]] for g in groups]
    blocks: list[tuple[str, tuple[float, float, float, float], str]] = []
    for group in merged:
        text = " ".join(ln.text.strip() for ln in group)
        box = _union([ln.bbox for ln in group])
        if box[1] > 0.92 and text.replace("-", "").strip().isdigit():
            kind = "page_number"
        elif text.lower().startswith(("figure", "fig.", "table")):
            kind = "image_caption" if text.lower().startswith("fig") else "table_caption"
        elif len(text) < 60 and not text.rstrip().endswith("."):
            kind = "title"
        else:
            kind = "text"
        blocks.append((kind, box, text))
    for column in (0, 1):
        members = (
            [ln for ln in labels if (ln.bbox[0] + ln.bbox[2]) / 2 >= 0.5]
            if column
            else [ln for ln in labels if (ln.bbox[0] + ln.bbox[2]) / 2 < 0.5]
        )
        if members:
            x0, y0, x1, y1 = _union([ln.bbox for ln in members])
            pad = 0.01
            box = (max(0.0, x0 - pad), max(0.0, y0 - pad), min(1.0, x1 + pad), min(1.0, y1 + pad))
            blocks.append(("image", box, ""))
    blocks.sort(key=lambda b: (b[1][0] >= 0.5, b[1][1]))  # column by column, top down
    return blocks


def layout_string(blocks: list[tuple[str, tuple[int, int, int, int]]]) -> str:
    """What MinerU2.5's layout step writes for these blocks."""
    return "".join(
        f"<|box_start|>{x0:03d} {y0:03d} {x1:03d} {y1:03d}<|box_end|>"
        f"<|ref_start|>{kind}<|ref_end|><|rotate_up|>\n"
        for kind, (x0, y0, x1, y1) in blocks
    )


def page_plan(pdf: Path, page_idx: int, count: QwenCounter | ModelCounter) -> PagePlan:
    sys.path.insert(0, str(REPO))
    from daemon.input.textlayer import pdf_text_layer

    lines = pdf_text_layer(pdf, None, page_idx)
    grouped = group_blocks(list(lines))
    boxes = [(kind, _box(bbox)) for kind, bbox, _text in grouped]
    layout = layout_string(boxes)
    blocks = tuple(
        PlanBlock(kind, box, text, count.count(text) + 1 if text else 0)
        for (kind, box), (_k, _b, text) in zip(boxes, grouped, strict=True)
    )
    return PagePlan(
        pdf=str(pdf),
        page_idx=page_idx,
        blocks=blocks,
        layout=layout,
        layout_tokens=count.count(layout) + 1,  # + end-of-turn
        counted_with=count.name,
    )


# MinerU2.5's image processor sizes (preprocessor_config.json: shortest_edge/longest_edge
# in pixels, 14-pixel patches merged 2x2).
MIN_PIXELS, MAX_PIXELS, PATCH, MERGE = 3136, 1003520, 14, 2


def image_patches(image: Any) -> int:
    """The vision patches the processor makes of `image` (PIL)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    width, height = image.size
    h, w = smart_resize(height, width, factor=PATCH * MERGE, min_pixels=MIN_PIXELS,
                        max_pixels=MAX_PIXELS)  # fmt: skip
    return int(h // PATCH) * int(w // PATCH)


def page_patches(plan: PagePlan, image: Any) -> tuple[int, tuple[int, ...]]:
    """The layout image's patches and each recognised block crop's, as mineru-vl-utils cuts
    them from the rendered page (`image`): what daemon/common/estimate.py's TYPICAL_PAGE
    holds for DEFAULT_PAGE at 200 DPI."""
    sys.path.insert(0, str(REPO))
    from mineru_vl_utils.structs import ContentBlock

    from daemon.engines.mineru.engine import make_helper

    helper = make_helper()
    blocks = [ContentBlock(b.type, [v / 1000 for v in b.bbox]) for b in plan.blocks]
    crops, _prompts, _params, _indices = helper.prepare_for_extract(image, blocks)
    layout = image_patches(helper.prepare_for_layout(image))
    return layout, tuple(image_patches(crop) for crop in crops)


def long_document(cache: Path) -> Path:
    """The 12-page document: the first pages of LONG_DOCUMENT_SOURCE, written once."""
    import pypdfium2 as pdfium

    target = cache / f"{LONG_DOCUMENT_SOURCE.stem}-{LONG_DOCUMENT_PAGES}pages.pdf"
    if not target.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        source = pdfium.PdfDocument(str(LONG_DOCUMENT_SOURCE))
        subset = pdfium.PdfDocument.new()
        subset.import_pages(source, list(range(LONG_DOCUMENT_PAGES)))
        partial = target.with_suffix(".part")
        subset.save(str(partial))
        partial.replace(target)
    return target


def default_documents(cache: Path) -> list[Path]:
    """The document paths' documents: 4 pages and 12 pages."""
    return [DEFAULT_DOCUMENT, long_document(cache)]


def main() -> int:
    """Print the plan of a page: `python bench/realistic.py [PDF PAGE_IDX]`."""
    pdf = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_PAGE[0]
    idx = int(sys.argv[2]) if len(sys.argv) > 2 else DEFAULT_PAGE[1]
    cache = Path("~/.cache/docinbox-bench").expanduser()
    plan = page_plan(pdf, idx, counter(cache / "mineru2.5-shape", cache / "qwen-tokenizer"))
    print(json.dumps(plan.as_dict(), indent=1, ensure_ascii=False))
    print(
        f"{len(plan.blocks)} blocks, layout {plan.layout_tokens} tokens, blocks "
        f"{sum(b.tokens for b in plan.blocks)} tokens ({plan.counted_with})",
        file=sys.stderr,
    )
    from daemon.config.settings import LimitsConfig
    from daemon.input.raster import render_page
    from daemon.input.sniff import inspect

    limits = LimitsConfig()
    page = render_page(pdf, inspect(pdf, passwords=(), limits=limits), idx, dpi=200,
                       max_long_side=4000, max_image_pixels=limits.max_image_pixels)  # fmt: skip
    layout, crops = page_patches(plan, page.image)
    tokens = tuple(b.tokens for b in plan.blocks if b.tokens and b.type != "image")
    print(
        f"at 200 DPI: layout image {layout} patches, crops {crops} ({sum(crops)}), block "
        f"tokens {tokens}: daemon/common/estimate.py's TYPICAL_PAGE",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
