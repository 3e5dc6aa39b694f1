"""Character error rate and speed of the `lite` engine on the corpus pages with ground truth.

    python bench/quality.py [--corpus ../shared/corpus] [--json out.json]
    python bench/quality.py --orientation-study      # ocr vs tiles orientation detectors

Order-sensitive CER: Levenshtein distance between the engine's Markdown and the ground truth,
divided by the ground truth's length, after both are reduced to their words (Markdown marks,
table pipes, image placeholders and line breaks removed, whitespace collapsed). A page read
in the wrong order pays for every moved character twice, so reading order counts.

The ground truth (`groundtruth/` in the corpus) is another converter's output, not human
checked. Where it covers more pages than the file has (the 2-page TIFF of a 9-page paper),
each page is compared with the stretch of the ground truth it matches (`windowed_cer`).

The study rotates every scanned corpus page with ground truth, plus the born-digital ones
rendered as images, by 0/90/180/270 degrees and reports how often each detector finds the
turn, and its time per page. The figures are in docs/quality.md.

Runs against whatever `daemon` package is first on sys.path, so the same script measures an
older checkout: `PYTHONPATH=/path/to/old/checkout python bench/quality.py`.
"""

from __future__ import annotations

import argparse
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

_MD_NOISE = re.compile(r"<!--.*?-->|^#+\s|^\|?\s*-[-\s|]*$|\*\*|!\[[^\]]*\]\([^)]*\)", re.M)


def normalise(markdown: str) -> str:
    text = _MD_NOISE.sub(" ", markdown)
    text = text.replace("|", " ")
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


def make_engine(orientation: str | None) -> Any:
    from daemon.engines.lite import engine as lite

    kwargs: dict[str, Any] = {}
    if orientation and "orientation" in inspect.signature(lite.LiteEngine).parameters:
        kwargs["orientation"] = orientation
    engine = lite.LiteEngine(EngineConfig(name="lite", threads=0), **kwargs)
    engine.load()
    return engine


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


def quality(corpus: Path, dpi: int, orientation: str | None) -> list[dict[str, Any]]:
    engine = make_engine(orientation)
    rows: list[dict[str, Any]] = []
    for case in CASES:
        path = corpus / case.file
        truth_path = corpus / "groundtruth" / case.truth
        if not path.is_file() or not truth_path.is_file():
            print(f"skip {case.file}: missing", file=sys.stderr)
            continue
        load_before = loadavg()
        markdown, seconds, infos, per_page = run_document(engine, path, dpi)
        hyp = normalise(markdown)
        ref = normalise(truth_path.read_text(encoding="utf-8"))
        if case.truth_covers_more:
            score = windowed_cer([normalise(p) for p in per_page], ref)
        else:
            score = cer(hyp, ref)
        row = {
            "file": case.file,
            "group": case.group,
            "cer": round(score, 4),
            "pages": len(seconds),
            "s_per_page": round(statistics.mean(seconds), 2) if seconds else 0.0,
            "loadavg": load_before,
            "angles": [i.get("orientation", {}).get("angle") for i in infos],
            "dropped": [i.get("dropped_lines") for i in infos],
            "upright_of": case.upright_of,
        }
        if case.known_text:
            row["cer_known_text"] = round(cer(hyp, normalise(case.known_text)), 4)
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
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not args.corpus.is_dir():
        sys.exit(f"no corpus at {args.corpus}")
    print(f"cpus={os.cpu_count()} loadavg={loadavg()}", file=sys.stderr)
    out: Any
    if args.orientation_study:
        out = orientation_study(args.corpus, args.dpi)
    else:
        out = quality(args.corpus, args.dpi, args.orientation)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
