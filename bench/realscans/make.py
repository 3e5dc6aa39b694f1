"""Rebuild bench/realscans/ from the source repositories' files (provenance, not a test).

    python bench/realscans/make.py TAPUSCORPUS_DIR GT_STRUCTURE_TEXT_DIR FONDUE_EN_PRINT_20_DIR \
        INKBENCH_DIR

Each directory is a checkout (or extracted snapshot) of the commit named in MANIFEST.tsv
(FETCH.tsv for the pages that are fetched, not kept: see the README).
What it converts, so the ground truth can be checked against the sources:

- ALTO (tapuscorpus, FONDUE-EN-PRINT-20): the typewritten or printed lines of every
  TextBlock, top to bottom, joined by spaces. Blocks in reading order: the columns are the
  blocks the corpus marks MainZone that are at least a tenth of the page high; the other
  blocks (a title, the page number, a running head, a margin note) that start above the
  columns come first, by their top edge; then the columns left to right; then the rest by
  their top edge. Handwritten lines (line type "Handwritten") and the tapuscorpus marks are
  dropped: `~~~` (a handwritten word), the `_` before an underlined word, the `^` before a
  superscript.
- PAGE (gt_structure_text): the TextLine transcriptions of each region, top to bottom (the
  file stores some out of order), regions in the PAGE reading order (the region-level
  TextEquiv repeats the lines and is not used).
- All: a word hyphenated at a line end followed by a lower-case letter is joined ("ser-" +
  "rait" -> "serait"), as a reader (and the engine) reads it; other line-end hyphens stay.
  FONDUE marks a line-end hyphen `¬`: read as `-` for this.
- Library of Congress "By the People" (via nealcaren/InkBench, `benchmark-txt/`): the
  volunteers' plain text, lines joined. Their marks are read as the volunteers' guide
  defines them: `[*...*]` is a note on handwriting or marginalia (a handwritten caption,
  "[*Photo*]") and is dropped with the handwriting; a bracketed description of a picture
  ("[illustration of a pair of skates]", "[head-shot photo of ...]") is dropped; `[?]` (an
  illegible word) is dropped; `[word?]` (an uncertain reading) is read as the word.
- Images: the JPEGs are copied byte for byte (the UN page's JPEG says 72 dpi, which is not
  the scan's resolution; the bench reads images at their pixel size). The bilevel 600 dpi
  TIFFs are downscaled to 300 dpi (box filter, threshold at half) and stored as 1-bit PNG
  with their resolution.
"""

from __future__ import annotations

import re
import shutil
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent

# local name -> path in the source repository (without extension)
TAPUS = {
    "tapus-gallica-btv1b10583038c-f25": "data/12148-btv1b10583038c/24_ac2b1_default",
    "tapus-gallica-btv1b10583038c-f27": "data/12148-btv1b10583038c/26_0f21a_default",
    "tapus-gallica-btv1b10583038c-f29": "data/12148-btv1b10583038c/28_59627_default",
    "tapus-gallica-btv1b10583038c-f31": "data/12148-btv1b10583038c/30_d08ac_default",
    "tapus-europeana-1914-1918-10763": (
        "data/europeana-random-selection/2020601_https___1914_1918_europeana_eu_contributions_10763"
    ),
}
FONDUE = {
    "fondue-un-a-res-44-192-p2": "data/A_RES_44_192-EN/A_RES_44_192-EN_2",
}
# nealcaren/InkBench: Library of Congress By the People pages (image and transcription)
LOC = {
    "loc-terrell-chicago-tribune-1929-12-10-p9": "mss425490753-19",
    "loc-nawsa-des-moines-register-1916-05-24-p6": "mss3413201323-27",
}
# Same source, fetched rather than kept (copyright not confirmed: FETCH.tsv says why)
LOC_FETCHED = {
    "loc-catt-diary-anuradhapura-spread": "mss154040008-47",
    "loc-blackwell-tribute-spread": "mss1288000676-23",
    "loc-catt-woman-citizen-1931-04-p17": "mss154040483-95",
}
DTA = {
    "dta-bebel-frau-1879-0146": "data/bebel_frau_1879/GT-PAGE/bebel_frau_1879_0146",
    "dta-bebel-frau-1879-0168": "data/bebel_frau_1879/GT-PAGE/bebel_frau_1879_0168",
}

_ALTO = "{http://www.loc.gov/standards/alto/ns-v4#}"
_PAGE = "{http://schema.primaresearch.org/PAGE/gts/pagecontent/2019-07-15}"


def join_lines(lines: list[str]) -> str:
    text = ""
    for line in (x.strip().replace("¬", "-") for x in lines):
        if not line:
            continue
        if re.search(r"[^\W\d_]-$", text) and line[:1].islower():
            text = text[:-1] + line  # a word hyphenated at the line end
        else:
            text = f"{text} {line}" if text else line
    return " ".join(text.split())


_PICTURE_NOTE = re.compile(r"illustration|photo|picture|image|drawing|cartoon", re.I)


def _loc_mark(match: re.Match[str]) -> str:
    inner = match.group(1)
    if inner.startswith("*") or _PICTURE_NOTE.search(inner):
        return " "  # handwriting, marginalia, a description of a picture
    return " " + inner.replace("?", "").strip() + " "  # "[?]" -> nothing, "[word?]" -> word


def loc_text(path: Path) -> str:
    text = re.sub(r"\[([^\]]*)\]", _loc_mark, path.read_text(encoding="utf-8"))
    return join_lines(text.splitlines())


def alto_text(path: Path) -> str:
    root = ET.parse(path).getroot()
    tags = {t.get("ID"): t.get("LABEL", "") for t in root.iter(f"{_ALTO}OtherTag")}
    height = float(next(root.iter(f"{_ALTO}Page")).get("HEIGHT", "1"))
    blocks = list(root.iter(f"{_ALTO}TextBlock"))

    columns = [
        b for b in blocks
        if tags.get(b.get("TAGREFS")) == "MainZone" and float(b.get("HEIGHT", "0")) >= 0.1 * height
    ]
    top = min((float(b.get("VPOS", "0")) for b in columns), default=height)

    def key(block: ET.Element) -> tuple[int, float]:
        if block in columns:
            return (1, float(block.get("HPOS", "0")))
        vpos = float(block.get("VPOS", "0"))
        return (0 if vpos < top else 2, vpos)

    lines: list[str] = []
    for block in sorted(blocks, key=key):
        in_block = sorted(block.iter(f"{_ALTO}TextLine"), key=lambda x: float(x.get("VPOS", "0")))
        for line in in_block:
            if "Handwritten" in tags.get(line.get("TAGREFS"), ""):
                continue
            words = [s.get("CONTENT", "") for s in line.iter(f"{_ALTO}String")]
            text = " ".join(words).replace("~~~", " ")
            lines.append(re.sub(r"(^|\s)[_^]+", r"\1", text))
    return join_lines(lines)


def page_text(path: Path) -> str:
    root = ET.parse(path).getroot()
    regions = {r.get("id"): r for r in root.iter(f"{_PAGE}TextRegion")}
    order = [
        ref.get("regionRef")
        for ref in sorted(
            root.iter(f"{_PAGE}RegionRefIndexed"), key=lambda r: int(r.get("index", "0"))
        )
    ]
    lines: list[str] = []
    for rid in order:
        region = regions.get(rid)
        if region is None:
            continue
        for line in sorted(region.iter(f"{_PAGE}TextLine"), key=_top):
            uni = line.find(f"{_PAGE}TextEquiv/{_PAGE}Unicode")
            lines.append(uni.text or "" if uni is not None else "")
    return join_lines(lines)


def _top(line: ET.Element) -> int:
    coords = line.find(f"{_PAGE}Coords")
    points = coords.get("points", "") if coords is not None else ""
    return min((int(p.split(",")[1]) for p in points.split()), default=0)


def bilevel_300(src: Path, dst: Path) -> None:
    from PIL import Image

    with Image.open(src) as im:
        grey = im.convert("L")
        half = grey.resize((grey.width // 2, grey.height // 2), Image.Resampling.BOX)
        half.point(lambda v: 255 if v >= 128 else 0).convert("1").save(dst, dpi=(300, 300))


def main() -> None:
    tapus, dta, fondue, inkbench = (Path(a) for a in sys.argv[1:5])
    (HERE / "images").mkdir(exist_ok=True)
    (HERE / "truth").mkdir(exist_ok=True)
    for name, stem, root in [(*x, tapus) for x in TAPUS.items()] + [
        (*x, fondue) for x in FONDUE.items()
    ]:
        found = (root / stem).parent.glob(Path(stem).name + ".*")
        image = next(p for p in found if p.suffix in (".jpg", ".jpeg"))
        shutil.copyfile(image, HERE / "images" / f"{name}.jpg")
        text = alto_text(root / f"{stem}.xml")
        (HERE / "truth" / f"{name}.txt").write_text(text + "\n", encoding="utf-8")
    for name, stem in DTA.items():
        bilevel_300(dta / f"{stem}.tif", HERE / "images" / f"{name}.png")
        text = page_text(dta / f"{stem}.xml")
        (HERE / "truth" / f"{name}.txt").write_text(text + "\n", encoding="utf-8")
    (HERE / "fetched").mkdir(exist_ok=True)
    for name, asset, where in [(*x, "images") for x in LOC.items()] + [
        (*x, "fetched") for x in LOC_FETCHED.items()
    ]:
        shutil.copyfile(
            inkbench / "benchmark-images" / f"{asset}.jpg", HERE / where / f"{name}.jpg"
        )
        text = loc_text(inkbench / "benchmark-txt" / f"{asset}.txt")
        (HERE / "truth" / f"{name}.txt").write_text(text + "\n", encoding="utf-8")

if __name__ == "__main__":
    main()
