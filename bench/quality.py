"""Character error rate and speed of the `lite` engine on the corpus pages with ground truth.

    python bench/quality.py [--corpus ../shared/corpus] [--json out.json]
    python bench/quality.py --orientation-study      # ocr vs tiles orientation detectors
    python bench/quality.py --only magazine --order plain   # plain XY-cut, for comparison
    python bench/quality.py --only realscans       # the real scans with human transcriptions
    python bench/quality.py --page 2206.01062 --save-md out/   # pages whose name has this

Order-sensitive CER: Levenshtein distance between the engine's Markdown and the ground truth,
divided by the ground truth's length, after both are reduced to their words (Markdown marks,
table pipes, HTML tags, image placeholders and line breaks removed, whitespace collapsed).
A table counts by its cells' text in row order, whether it is written as Markdown pipes (the
corpus ground truth) or as HTML (the engines' tables): the transcriptions are plain text, so
tags would be charged as errors that no reading could avoid. Prose taken for a table still
pays, for its cells out of order; docs/quality.md says why. A page read
in the wrong order pays for every moved character twice, so reading order counts.

The ground truth (`groundtruth/` in the corpus) is another converter's output, not human
checked. Where it covers more pages than the file has (the 2-page TIFF of a 9-page paper),
each page is compared with the stretch of the ground truth it matches (`windowed_cer`).

Magazine pages: the corpus has no magazine scans with a human transcription, so the bench
makes them (`magazine_pages`). The text layers of two public born-digital two-column PDFs
in the corpus (a LaTeX sample, a page of an arXiv paper) are the ground truth; their
sentences are typeset again as magazine pages by tests/magazine.py: two and three
columns, a picture across a gutter with the text of both columns running around it, a
caption, a spanning headline, a drop cap, two stories on one page, and two pages side by
side as a spread; rendered at 200-300 dpi, turned 0.3-0.7 degrees, blurred, grainy and
JPEG-compressed. Besides CER each page gets a reading-order score: the share of the
ground truth's sentences found in the output in their order (the longest run in order
over the sentences, located by fuzzy alignment).

Real scans (`bench/realscans/`, in this repository): scanned pages with a human
transcription from public ground-truth sets (typewritten two-column pages, a printed
two-column page with footnotes, a diary page photographed at 400 dpi, bilevel 300 dpi book
pages, two newspaper pages, one with a photograph and illustrated advertisements);
MANIFEST.tsv there names each file's source, commit and licence, and make.py how the
transcription became plain text in reading order. Pages not kept for their copyright (two
spreads and a magazine page: FETCH.tsv) are read from `fetched/` when make.py has put them
there. They are their own group, "real scans", with CER and the reading-order score.

The study rotates every scanned corpus page with ground truth, plus the born-digital ones
rendered as images, by 0/90/180/270 degrees and reports how often each detector finds the
turn, and its time per page. The figures are in docs/quality.md.

Runs against whatever `daemon` package is first on sys.path, so the same script measures an
older checkout: `PYTHONPATH=/path/to/old/checkout python bench/quality.py`.
"""

from __future__ import annotations

import argparse
import html
import inspect
import json
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))

from daemon.config.settings import EngineConfig, LimitsConfig  # noqa: E402

# Older checkouts (one render/output module) first: with PYTHONPATH pointing at one, an
# editable install of a newer docinbox could otherwise lend it the newer subpackages.
try:
    from daemon.engines.base import PageOptions, no_progress  # type: ignore[import-not-found]
    from daemon.render import inspect as inspect_document  # type: ignore[import-not-found]
    from daemon.render import render_page  # mypy reports a missing module only once

    from daemon.output import pages_to_markdown  # type: ignore[attr-defined]
except ImportError:
    from daemon.document.page import PageOptions, no_progress
    from daemon.input.raster import render_page
    from daemon.input.sniff import inspect as inspect_document
    from daemon.output.formats.markdown import pages_to_markdown


@dataclass(frozen=True)
class Case:
    file: str  # relative to the corpus
    truth: str  # relative to corpus/groundtruth
    group: str  # clean-scan | rotated | born-digital | hard-scan
    upright_of: str | None = None  # the rotated copy's upright file
    truth_covers_more: bool = False
    # Checked by looking at the page renders, where the ground truth itself is OCR noise.
    known_text: str | None = None


CASES = (
    Case("pdf/docling__ocr_test.pdf", "docling__ocr_test.tesseract.full_page.md", "clean-scan"),
    Case(
        "images/docling__webp-test.webp",
        "docling__webp-test.tesseract.full_page.md",
        "clean-scan",
    ),
    Case(
        "images/docling__2206.01062.tif",
        "docling__2206.01062.md",
        "clean-scan",
        truth_covers_more=True,
    ),
    *(
        Case(
            f"pdf/docling__ocr_test_rotated_{a}.pdf",
            f"docling__ocr_test_rotated_{a}.tesseract.full_page.md",
            "rotated",
            upright_of="pdf/docling__ocr_test.pdf",
        )
        for a in (90, 180, 270)
    ),
    Case(
        "pdf/docling__nemotron_multipage.pdf",
        "docling__nemotron_multipage.nemotron_ocr.full_page.md",
        "hard-scan",
        # Four pages, each the same sentence, pages 2-4 stored turned 180/90/270; the ground
        # truth is another OCR's reading of the turned pages ("Bockktd JSON and Markdowwn").
        known_text=" ".join(
            ["Docling bundles PDF document conversion to JSON and Markdown in an easy self "
             "contained package"] * 4
        ),
    ),
    Case("pdf/docling__2305.03393v1-pg9.pdf", "docling__2305.03393v1-pg9.md", "born-digital"),
    Case("pdf/docling__amt_handbook_sample.pdf", "docling__amt_handbook_sample.md", "born-digital"),
)

_MD_NOISE = re.compile(
    r"<!--.*?-->|^#+\s|^\|?\s*-[-\s|]*$|\*\*|!\[[^\]]*\]\([^)]*\)|</?[a-zA-Z][^<>]*>", re.M
)


def normalise(markdown: str) -> str:
    text = _MD_NOISE.sub(" ", markdown)
    text = html.unescape(text).replace("|", " ")
    return " ".join(text.split())


def cer(hyp: str, ref: str) -> float:
    from rapidfuzz.distance import Levenshtein

    if not ref:
        return 0.0 if not hyp else 1.0
    return float(Levenshtein.distance(hyp, ref)) / len(ref)


def windowed_cer(pages: list[str], ref: str) -> float:
    """CER of each page against the stretch of `ref` it matches, summed over the pages.

    For ground truth that covers more than the file (a 9-page paper's text for a 2-page
    TIFF): every 80 characters of a page are located in the ground truth by fuzzy
    alignment; the stretch from the 5th to the 95th percentile of the confident matches
    (a running head that also matches the title on page 1 is an outlier) is the page's
    reference, compared order-sensitively.
    """
    import numpy as np
    from rapidfuzz import fuzz
    from rapidfuzz.distance import Levenshtein

    size = 80
    distance = length = 0
    for hyp in pages:
        if not hyp:
            continue
        starts: list[int] = []
        ends: list[int] = []
        for offset in range(0, max(1, len(hyp) - size + 1), size):
            found = fuzz.partial_ratio_alignment(hyp[offset : offset + size], ref)
            if found is not None and found.score >= 90:
                starts.append(found.dest_start)
                ends.append(found.dest_end)
        if not starts:
            distance += len(hyp)  # nothing matched: every character is an error
            length += len(hyp)
            continue
        start = int(np.percentile(starts, 5))
        end = int(np.percentile(ends, 95))
        window = ref[start:max(end, start + 1)]
        distance += Levenshtein.distance(hyp, window)
        length += len(window)
    return distance / max(length, 1)


def order_score(hyp: str, ref: str) -> float:
    """Share of `ref`'s sentences that appear in `hyp` in the same order."""
    from rapidfuzz import fuzz

    sents = [x for x in _sentences(ref) if len(x) >= 25]
    if not sents:
        return 1.0
    positions: list[int] = []
    after = 0
    for sent in sents:
        # Looked for just after the previous sentence first: a sentence that occurs twice
        # (lorem ipsum repeats itself) is the copy where the reading goes on.
        found = fuzz.partial_ratio_alignment(sent, hyp[after : after + 3 * len(sent)])
        if found is not None and found.score >= 80:
            positions.append(after + found.dest_start)
            after += found.dest_end
            continue
        found = fuzz.partial_ratio_alignment(sent, hyp)
        if found is not None and found.score >= 80:
            positions.append(found.dest_start)
    return _longest_increasing(positions) / len(sents)


def _sentences(text: str) -> list[str]:
    out: list[str] = []
    current: list[str] = []
    for word in text.split():
        current.append(word)
        if word.endswith((".", "?", "!")) and len(current) >= 3:
            out.append(" ".join(current))
            current = []
    if current:
        out.append(" ".join(current))
    return out


def _longest_increasing(values: list[int]) -> int:
    import bisect

    tails: list[int] = []
    for v in values:
        k = bisect.bisect_left(tails, v)
        if k == len(tails):
            tails.append(v)
        else:
            tails[k] = v
    return len(tails)


def corpus_text(pdf: Path) -> str:
    """A born-digital PDF's text layer in its own (column) order, words whole."""
    import unicodedata

    import pypdfium2 as pdfium

    doc = pdfium.PdfDocument(str(pdf))
    try:
        text = " ".join(doc[i].get_textpage().get_text_range() for i in range(len(doc)))
    finally:
        doc.close()
    # pdfium marks a hyphen that breaks a word at the line end as U+0002 or U+FFFE.
    text = re.sub(r"[\x02\ufffe]\s*", "", text)
    return " ".join(unicodedata.normalize("NFKC", text).split())


def prose(text: str) -> list[str]:
    """The text's sentences that are prose: table cells, numbers and headings left out."""
    out = []
    for sent in _sentences(text):
        visible = [ch for ch in sent if not ch.isspace()]
        letters = sum(ch.isalpha() for ch in visible)
        if len(sent.split()) >= 6 and letters >= 0.8 * len(visible) and sent[0].isupper():
            out.append(sent)
    return out


@dataclass(frozen=True)
class MadePage:
    name: str
    image: Any  # PIL image as the scanner returns it
    truth: str
    dpi: int
    lines: Any = None  # the typeset lines (pixels, before the scan's skew), for debugging
    pictures: Any = None  # the pictures' boxes, likewise


def _made(name: str, page: Any, dpi: int) -> MadePage:
    return MadePage(name, page.image, page.text, dpi, page.lines, page.pictures)


def magazine_pages(corpus: Path) -> list[MadePage]:
    """Magazine pages typeset from the corpus's born-digital two-column PDFs."""
    import importlib.util

    # Loaded by path: with PYTHONPATH at an older checkout, `tests` is that checkout's.
    spec = importlib.util.spec_from_file_location("magazine", REPO / "tests" / "magazine.py")
    if spec is None or spec.loader is None:
        raise RuntimeError("tests/magazine.py is missing")
    mag = importlib.util.module_from_spec(spec)
    sys.modules["magazine"] = mag  # dataclasses look their module up
    spec.loader.exec_module(mag)
    latin = prose(corpus_text(corpus / "pdf" / "pypdf__multicolumn.pdf"))
    english = prose(corpus_text(corpus / "pdf" / "docling__2305.03393v1-pg9.pdf")) + prose(
        corpus_text(corpus / "pdf" / "docling__amt_handbook_sample.pdf")
    )

    def paras(sents: list[str], start: int, per: int = 4) -> list[str]:
        chosen = sents[start:] + sents[:start]
        return [" ".join(chosen[i : i + per]) for i in range(0, len(chosen), per)]

    def a4(dpi: int) -> tuple[tuple[int, int], int]:
        return (round(8.27 * dpi), round(11.69 * dpi)), round(10 / 72 * dpi)

    pages: list[MadePage] = []
    size, px = a4(200)
    page = mag.typeset(
        [mag.Article("Lorem ipsum across the gutter", paras(latin, 0), 2, 1.0,
                     mag.Picture(0, 1, 0.3, 0.25, "Hills under a summer sky, seen across "
                                 "the gutter between the columns."))],
        size=size, font_px=px,
    )
    pages.append(_made("magazine-2col-picture", page, 200))
    size, px = a4(250)
    page = mag.typeset(
        [mag.Article("Table structure in three columns", paras(english, 0, 3), 3, 1.0,
                     mag.Picture(1, 2, 0.12, 0.22, "A picture that crosses the second "
                                 "gutter, with text on both sides."))],
        size=size, font_px=round(px * 0.9),
    )
    pages.append(_made("magazine-3col-picture", page, 250))
    size, px = a4(300)
    page = mag.typeset(
        [
            mag.Article("First story on top", paras(latin, 12), 2, 0.45,
                        mag.Picture(0, 1, 0.3, 0.4, "The first story's picture.")),
            mag.Article("Second story below the first", paras(english, 8), 2, 0.55,
                        mag.Picture(0, 1, 0.15, 0.3, "The second story's picture, "
                                    "across the gutter.")),
        ],
        size=size, font_px=px,
    )
    pages.append(_made("magazine-two-stories", page, 300))
    size, px = a4(200)
    left = mag.typeset(
        [mag.Article("The left page of a spread", paras(latin, 24), 2, 1.0,
                     mag.Picture(0, 1, 0.5, 0.2, "A picture on the left page."))],
        size=size, font_px=px,
    )
    right = mag.typeset(
        [mag.Article("The right page of the spread", paras(english, 16), 2, 1.0,
                     mag.Picture(0, 1, 0.08, 0.25, "A picture on the right page."))],
        size=size, font_px=px,
    )
    page = mag.spread(left, right)
    pages.append(_made("spread", page, 200))
    skews = (0.4, -0.6, 0.3, -0.5)
    return [
        MadePage(
            p.name,
            mag.scanned(p.image, skew=k, noise=10.0, seed=i),
            p.truth,
            p.dpi,
            p.lines,
            p.pictures,
        )
        for i, (p, k) in enumerate(zip(pages, skews, strict=True))
    ]


def plain_xy_cut(items: Any, box_of: Any, *, rtl: bool = False) -> list[Any]:
    """Textbook XY-cut, for comparison: cut at the widest blank strip either way, recurse."""
    boxes = [box_of(it) for it in items]

    def cut(idx: list[int]) -> list[int]:
        if len(idx) <= 1:
            return idx
        best: tuple[float, int, float] | None = None  # width, axis, position
        for axis in (0, 1):
            spans = sorted((boxes[i][axis], boxes[i][axis + 2]) for i in idx)
            reach = spans[0][1]
            for a, b in spans[1:]:
                if a > reach and (best is None or a - reach > best[0]):
                    best = (a - reach, axis, (a + reach) / 2)
                reach = max(reach, b)
        if best is None:
            return sorted(idx, key=lambda i: (boxes[i][1], boxes[i][0]))
        _, axis, pos = best
        first = [i for i in idx if (boxes[i][axis] + boxes[i][axis + 2]) / 2 < pos]
        second = [i for i in idx if (boxes[i][axis] + boxes[i][axis + 2]) / 2 >= pos]
        if axis == 0 and rtl:
            first, second = second, first
        return cut(first) + cut(second)

    return [items[i] for i in cut(list(range(len(items))))]


def make_engine(orientation: str | None) -> Any:
    from daemon.engines.lite import engine as lite

    kwargs: dict[str, Any] = {}
    if orientation and "orientation" in inspect.signature(lite.LiteEngine).parameters:
        kwargs["orientation"] = orientation
    engine = lite.LiteEngine(EngineConfig(name="lite", threads=0), **kwargs)
    engine.load()
    return engine


def as_handed_on(page: Any) -> Any:
    """The page with its PDF text layer, as the worker's pipeline hands it to the engine
    (in an older checkout the engines read the text layer themselves)."""
    try:
        from daemon.input.textlayer import with_text_layer
    except ImportError:
        return page
    return with_text_layer(page, PageOptions())


def run_document(
    engine: Any, path: Path, dpi: int
) -> tuple[str, list[float], list[Any], list[str]]:
    info = inspect_document(path, passwords=(), limits=LimitsConfig())
    pages = []
    seconds: list[float] = []
    infos: list[Any] = []
    for idx in range(info.page_count):
        page = render_page(
            path, info, idx, dpi=dpi, max_long_side=4000, max_image_pixels=180_000_000
        )
        page = as_handed_on(page)
        start = time.perf_counter()
        result = engine.parse_page(page, PageOptions(), no_progress)
        seconds.append(time.perf_counter() - start)
        pages.append(result.blocks)
        infos.append(result.info)
    return pages_to_markdown(pages), seconds, infos, [pages_to_markdown([p]) for p in pages]


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


@dataclass(frozen=True)
class Picked:
    """Which pages a run reads (`--page`: a part of the name) and where their output goes."""

    page: str = ""
    save_md: Path | None = None

    def wants(self, name: str) -> bool:
        return self.page in name

    def save(self, name: str, markdown: str) -> None:
        if self.save_md is not None:
            self.save_md.mkdir(parents=True, exist_ok=True)
            (self.save_md / f"{Path(name).name}.md").write_text(markdown, encoding="utf-8")


def quality(
    corpus: Path, dpi: int, orientation: str | None, only: str = "all", order: str = "current",
    picked: Picked = Picked(),
) -> list[dict[str, Any]]:
    engine = make_engine(orientation)
    if order == "plain":
        import daemon.engines.lite.compose as compose
        from daemon.engines.lite.reading_order import Reading

        def plain_reading(items: Any, box_of: Any, *, rtl: bool = False) -> Reading[Any]:
            return Reading(order=plain_xy_cut(items, box_of, rtl=rtl), columns=0)

        setattr(compose, "read_page", plain_reading)  # noqa: B010 - the name compose_page calls
    rows: list[dict[str, Any]] = []
    if only in ("all", "magazine"):
        rows += magazine_quality(engine, corpus, picked)
    if only in ("all", "realscans"):
        rows += realscan_quality(engine, dpi, picked)
    for case in CASES if only in ("all", "corpus") else ():
        if not picked.wants(case.file):
            continue
        path = corpus / case.file
        truth_path = corpus / "groundtruth" / case.truth
        if not path.is_file() or not truth_path.is_file():
            print(f"skip {case.file}: missing", file=sys.stderr)
            continue
        row, hyp = score_document(
            engine, path, truth_path, dpi, name=case.file, group=case.group,
            windowed=case.truth_covers_more, picked=picked,
        )
        row["upright_of"] = case.upright_of
        if case.known_text:
            row["cer_known_text"] = round(cer(hyp, normalise(case.known_text)), 4)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def score_document(
    engine: Any, path: Path, truth: Path, dpi: int, *, name: str, group: str,
    windowed: bool = False, picked: Picked = Picked(),
) -> tuple[dict[str, Any], str]:
    """The row of one document read against its ground truth, and the output compared."""
    load_before = loadavg()
    markdown, seconds, infos, per_page = run_document(engine, path, dpi)
    picked.save(name, markdown)
    hyp = normalise(markdown)
    ref = normalise(truth.read_text(encoding="utf-8"))
    score = windowed_cer([normalise(p) for p in per_page], ref) if windowed else cer(hyp, ref)
    row = {
        "file": name,
        "group": group,
        "cer": round(score, 4),
        "order": round(order_score(hyp, ref), 3),
        "pages": len(seconds),
        "s_per_page": round(statistics.mean(seconds), 2) if seconds else 0.0,
        "loadavg": load_before,
        "angles": [i.get("orientation", {}).get("angle") for i in infos],
        "dropped": [i.get("dropped_lines") for i in infos],
    }
    return row, hyp


REALSCANS = REPO / "bench" / "realscans"


def realscan_quality(engine: Any, dpi: int, picked: Picked = Picked()) -> list[dict[str, Any]]:
    """The real scans with their human transcriptions (`bench/realscans/`)."""
    rows: list[dict[str, Any]] = []
    # images/ is kept in the repository; fetched/ holds the pages make.py copies in from
    # their source (FETCH.tsv: kept out for their copyright) and is read when it is there.
    images = [p for d in ("images", "fetched") for p in sorted((REALSCANS / d).glob("*"))]
    for image in images:  # each has its transcription (tests/house/test_realscans.py)
        if not picked.wants(image.name):
            continue
        truth = REALSCANS / "truth" / f"{image.stem}.txt"
        row, _ = score_document(
            engine, image, truth, dpi, name=f"realscans/{image.name}", group="real scans",
            picked=picked,
        )
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def group_means(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Mean CER and reading-order score of each group, as the goals are stated."""
    out: dict[str, dict[str, float]] = {}
    for group in dict.fromkeys(r["group"] for r in rows):
        mine = [r for r in rows if r["group"] == group]
        out[group] = {
            "pages": len(mine),
            "mean_cer": round(statistics.mean(r["cer"] for r in mine), 4),
            "mean_order": round(statistics.mean(r["order"] for r in mine), 3),
        }
    return out


def magazine_quality(engine: Any, corpus: Path, picked: Picked = Picked()) -> list[dict[str, Any]]:
    from daemon.document.page import PageInput

    rows: list[dict[str, Any]] = []
    for made in magazine_pages(corpus):
        if not picked.wants(made.name):
            continue
        load_before = loadavg()
        page = PageInput(image=made.image, page_idx=0, page_count=1, dpi=made.dpi)
        start = time.perf_counter()
        result = engine.parse_page(page, PageOptions(), no_progress)
        seconds = time.perf_counter() - start
        markdown = pages_to_markdown([result.blocks])
        picked.save(made.name, markdown)
        hyp = normalise(markdown)
        ref = normalise(made.truth)
        row = {
            "file": made.name,
            "group": "magazine",
            "cer": round(cer(hyp, ref), 4),
            "order": round(order_score(hyp, ref), 3),
            "pages": 1,
            "s_per_page": round(seconds, 2),
            "loadavg": load_before,
            "size": list(made.image.size),
            "regions": result.info.get("regions"),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


# Pages that the file itself stores turned (the nemotron sample turns pages 2-4 on purpose):
# the counter-clockwise turn that makes each upright, checked by looking at the renders.
STORED_TURN = {
    "pdf/docling__nemotron_multipage.pdf#2": 180,
    "pdf/docling__nemotron_multipage.pdf#3": 90,
    "pdf/docling__nemotron_multipage.pdf#4": 270,
}


def orientation_study(corpus: Path, dpi: int) -> dict[str, Any]:
    """Each detector as the engine runs it: the whole OCR of a page, upright or turned.

    "off" is the engine without orientation: its time is the OCR alone, so the other
    methods' overhead is their time minus it.
    """
    engines = {m: make_engine(m) for m in ("off", "ocr", "tiles")}
    images: list[tuple[str, Any]] = []
    for case in CASES:
        if case.group == "rotated":
            continue  # the study turns the upright copy itself
        path = corpus / case.file
        if not path.is_file():
            continue
        info = inspect_document(path, passwords=(), limits=LimitsConfig())
        for idx in range(info.page_count):
            page = render_page(
                path, info, idx, dpi=dpi, max_long_side=4000, max_image_pixels=180_000_000
            )
            images.append((f"{case.file}#{idx + 1}", page.image))
    rows: list[dict[str, Any]] = []
    for name, image in images:
        for turn in (0, 90, 180, 270):
            # The scanner turned the sheet `turn` degrees clockwise; undoing it takes
            # `turn` counter-clockwise, plus whatever the file already stored.
            scan = image.rotate(-turn, expand=True) if turn else image
            truth = (turn + STORED_TURN.get(name, 0)) % 360
            for method, engine in engines.items():
                start = time.perf_counter()
                _, found, _ = engine._ocr_upright(scan)
                rows.append(
                    {
                        "page": name,
                        "truth": truth,
                        "method": method,
                        "angle": found.angle,
                        "seconds": time.perf_counter() - start,
                    }
                )
            print(json.dumps(rows[-3:]), flush=True)
    summary: dict[str, Any] = {"loadavg_end": loadavg(), "pages": len(images)}
    for method in engines:
        mine = [r for r in rows if r["method"] == method]
        summary[method] = {
            "correct": sum(1 for r in mine if r["angle"] == r["truth"]),
            "total": len(mine),
            "s_upright": round(statistics.mean(r["seconds"] for r in mine if r["truth"] == 0), 2),
            "s_turned": round(statistics.mean(r["seconds"] for r in mine if r["truth"] != 0), 2),
            "wrong": [
                (r["page"], r["truth"], r["angle"]) for r in mine if r["angle"] != r["truth"]
            ],
        }
    print(json.dumps(summary, indent=1))
    return {"summary": summary, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, default=REPO.parent / "shared" / "corpus")
    parser.add_argument("--dpi", type=int, default=200)
    parser.add_argument("--orientation", choices=("ocr", "tiles", "off"), default=None)
    parser.add_argument("--orientation-study", action="store_true")
    parser.add_argument(
        "--only", choices=("all", "corpus", "magazine", "realscans"), default="all"
    )
    parser.add_argument(
        "--order", choices=("current", "plain"), default="current",
        help="plain: the engine with a textbook XY-cut in place of its reading order",
    )
    parser.add_argument("--save-pages", type=Path, help="write the magazine pages here (PNG)")
    parser.add_argument("--page", default="", help="only the pages whose name contains this")
    parser.add_argument("--save-md", type=Path, help="write each page's Markdown output here")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not args.corpus.is_dir() and args.only != "realscans":  # the real scans live here
        sys.exit(f"no corpus at {args.corpus}")
    print(f"cpus={os.cpu_count()} loadavg={loadavg()}", file=sys.stderr)
    out: Any
    if args.orientation_study:
        out = orientation_study(args.corpus, args.dpi)
    else:
        if args.save_pages:
            args.save_pages.mkdir(parents=True, exist_ok=True)
            for made in magazine_pages(args.corpus):
                made.image.save(args.save_pages / f"{made.name}.png")
                (args.save_pages / f"{made.name}.txt").write_text(made.truth, encoding="utf-8")
        picked = Picked(args.page, args.save_md)
        out = quality(args.corpus, args.dpi, args.orientation, args.only, args.order, picked)
        print(json.dumps(group_means(out), indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
