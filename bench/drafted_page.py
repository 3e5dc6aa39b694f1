"""`auto-drafted` in bench/bench_mineru.py: the realistic page with drafts as good as OCR's.

The random-weight model writes noise no OCR reading can predict, so the lite engine's reading
of a crop would draft nothing. Instead each block's draft is the model's own greedy output
from a first parse of the page (the decode loop is lossless: the second parse writes the same
tokens), corrupted to the character error rate the lite engine's OCR measures on that page's
block crops against their text layer. The step costs of the real shape then meet the
acceptance a real OCR draft would get (bench/draft_acceptance.py measures that acceptance on
a trained decoder).

A token is wrong when any of its characters is: with the page's CER c and the plan's mean
characters per token n, a token is damaged with probability 1 - (1 - c)^n, as a substitution
(most often), a dropped token or an inserted one (OCR's three kinds of error), so the
decode loop's re-alignment is exercised as on a real reading.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from PIL import Image

    from daemon.engines.mineru.runtimes.base import GenRequest
    from daemon.engines.mineru.runtimes.drafts import DraftSource

# Shares of a damaged token's errors: substituted, dropped, a token inserted after it.
SUBSTITUTE, DROP = 0.6, 0.2


@dataclass(frozen=True)
class PageCer:
    cer: float  # edits / characters over the page's block crops
    chars: int
    blocks: int
    chars_per_token: float  # the plan's text per forced token


def page_cer(image: Image.Image, plan: dict[str, Any], threads: int) -> PageCer:
    """The lite engine's OCR of each text-bearing block crop against its text-layer text."""
    from rapidfuzz.distance import Levenshtein

    from bench.draft_acceptance import read_block
    from daemon.engines.lite.ocr import OcrReader

    reader = OcrReader(threads)
    width, height = image.size
    edits = chars = blocks = tokens = 0
    for block in plan["blocks"]:
        text = block["text"]
        if not text:
            continue
        x0, y0, x1, y1 = block["bbox"]
        crop = image.crop((x0 * width // 1000, y0 * height // 1000,
                           x1 * width // 1000, y1 * height // 1000))  # fmt: skip
        kind = "table" if block["type"] == "table" else "text"
        edits += Levenshtein.distance(read_block(reader, crop, kind), text)
        chars += len(text)
        tokens += block["tokens"]
        blocks += 1
    return PageCer(edits / max(1, chars), chars, blocks, chars / max(1, tokens))


def corrupt(tokens: Sequence[int], damage: float, vocab: int, seed: str) -> list[int]:
    """`tokens` with each one damaged with probability `damage` (seeded by `seed`)."""
    rng = random.Random(seed)
    out: list[int] = []
    for token in tokens:
        if rng.random() >= damage:
            out.append(token)
            continue
        kind = rng.random()
        if kind < SUBSTITUTE:
            out.append(rng.randrange(vocab))
        elif kind >= SUBSTITUTE + DROP:
            out += [token, rng.randrange(vocab)]
    return out


def row_key(row: GenRequest) -> str:
    """A block row, the same in both parses: its prompt and its crop's pixels."""
    digest = hashlib.sha1(row.prompt.encode())
    image = row.image
    digest.update(image if isinstance(image, bytes) else image.tobytes())
    return digest.hexdigest()


@dataclass
class OwnOutput:
    """The block rows' tokens of the first parse, by `row_key`."""

    tokens: dict[str, list[int]] = field(default_factory=dict)
    recording: bool = True

    def install(self, is_block_step: Callable[[], bool]) -> None:
        """Record from the decode loop's `decode` (LoopGenerator calls it by module name)."""
        from daemon.engines.mineru.runtimes import decode_loop

        original = decode_loop.decode

        def decode(batch: Any, requests: Any, *args: Any, **kwargs: Any) -> Any:
            results = original(batch, requests, *args, **kwargs)
            if self.recording and is_block_step():
                for result in results:
                    self.tokens[row_key(requests.rows[result.index])] = list(result.tokens)
            return results

        decode_loop.decode = decode

    def drafts(
        self,
        damage: float,
        vocab: int,
        fallback: Callable[[GenRequest], DraftSource | None],
    ) -> Callable[[GenRequest], DraftSource | None]:
        """`LoopGenerator.draft_for` for the second parse: a recorded row's own output,
        corrupted; any other row (the layout step) drafts as the engine drafts it."""
        from daemon.engines.mineru.runtimes.drafts import ExternalDraft

        def draft_for(row: GenRequest) -> DraftSource | None:
            key = row_key(row)
            own = self.tokens.get(key)
            if own is None:
                return fallback(row)
            return ExternalDraft(corrupt(own, damage, vocab, key))

        return draft_for


def drafted_first_run(
    parse: Callable[[], object], probe: Any, loop: Any, image: Image.Image, spec: dict[str, Any]
) -> dict[str, Any]:
    """Parse once recording the blocks' own output, then give `loop` the corrupted drafts
    and reset `probe` so the timed parse that follows is measured alone."""
    import time

    measured = page_cer(image, spec["plan"], spec.get("threads") or 2)
    own = OwnOutput()
    own.install(lambda: probe.phase == "block")
    start = time.monotonic()
    parse()
    first = time.monotonic() - start
    own.recording = False
    damage = 1 - (1 - measured.cer) ** measured.chars_per_token
    vocab = int(loop.model.lm_head.weight.shape[0])
    loop.draft_for = own.drafts(damage, vocab, loop.draft_for)
    totals = loop.totals
    record = {
        "first_parse_seconds": round(first, 2),  # the engine's own drafts (auto-loop)
        "first_parse_drafts": [totals.proposed, totals.accepted, totals.passes],
        "ocr_cer": round(measured.cer, 4),
        "ocr_blocks": measured.blocks,
        "ocr_chars": measured.chars,
        "chars_per_token": round(measured.chars_per_token, 2),
        "token_damage": round(damage, 4),
        "drafted_rows": len(own.tokens),
    }
    probe.phase, probe.layout_parsed_at, probe.generated_layout_chars = "layout", 0.0, 0
    for reset in (probe.calls, probe.finished, probe.row_caps, probe.row_pages):
        reset.clear()
    probe.forced.clear()
    return record


def drafted_table(paths: Sequence[dict[str, Any]]) -> list[str]:
    """The decode loop's paths side by side: passes, drafts, and what drafted them."""
    loops = [r for r in paths if r["path"] in ("auto-loop", "auto-loop-late", "auto-drafted")]
    if not loops:
        return []
    lines = [
        "",
        "| loop path | page s | decode passes | drafts accepted / proposed | blocks started "
        "early | OCR CER of the page's crops | token damage | first parse s (engine's drafts) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in loops:
        info = r.get("page_info", {})
        drafted = r.get("drafted", {})
        lines.append(
            f"| {r['path']} | {r['page_seconds']} | {info.get('decode_passes', '–')} "
            f"| {info.get('draft_accepted', '–')} / {info.get('draft_proposed', '–')} "
            f"| {info.get('early_blocks', '–')} | {drafted.get('ocr_cer', '–')} "
            f"| {drafted.get('token_damage', '–')} | {drafted.get('first_parse_seconds', '–')} |"
        )
    return lines
