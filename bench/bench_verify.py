"""What verifying a draft costs: one forward of K+1 tokens per row against one token.

The random model of the real shape (bench/make_model.py), loaded by the engine's own
load_model with `--precision` (default auto), rows prefilled through the decode loop's own
`DecodeBatch.join` (a text prompt of `--context` tokens each), then the verify forward the
loop runs (`DecodeBatch.step`'s inputs: [last, d0..dK-1] per row, explicit M-RoPE positions,
the batch's attention mask) for each K and batch size; the cache is cropped back after each
forward, so every figure sees the same context. Min of `--repeat` forwards; /proc/loadavg
read beside every figure (other jobs on the machine move the times, not the shape).

Also the per-position cost of generate()'s logits processors (no_repeat_ngram_size=100 over
the row's prefix), which the loop applies at every position it keeps.

    python bench/make_model.py
    python bench/bench_verify.py [--ks 0,1,2,4,8,12,16] [--rows 1,4,8] [--context 512]

`--out FILE` also writes the curve as JSON (rows, k, positions = rows x (1 + k), seconds): the
pass-cost curve bench/sched_replay.py models a page's decode time with.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
from transformers import LogitsProcessorList, StoppingCriteriaList

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_kernels import cpu_model
from bench.make_model import DEFAULT_OUT
from daemon.engines.mineru.runtimes.decode_loop import (
    DecodeBatch,
    DecodeRequest,
    decode,
    greedy_processors,
)
from daemon.engines.mineru.runtimes.drafts import DraftSource, ExternalDraft, PromptLookup
from daemon.engines.mineru.runtimes.transformers_generate import make_row_stops
from daemon.engines.mineru.runtimes.transformers_model import load_model

# MinerU's generate kwargs (mineru-vl-utils' build_generate_kwargs), less the token cap.
MINERU_KWARGS: dict[str, object] = {"no_repeat_ngram_size": 100, "do_sample": False}


def text_prompt(
    rows: int, context: int, vocab: int, generator: torch.Generator
) -> dict[str, torch.Tensor]:
    """`rows` random text prompts of `context` tokens, as the processor would return them."""
    ids = torch.randint(0, vocab, (rows, context), generator=generator)
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "mm_token_type_ids": torch.zeros_like(ids, dtype=torch.int),
    }


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text(encoding="utf-8").split()[:3])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--threads", type=int, default=0, help="0: the engine's default")
    parser.add_argument("--ks", default="0,1,2,4,8,12,16")
    parser.add_argument("--rows", default="1,4,8")
    parser.add_argument("--context", type=int, default=512, help="prompt tokens per row")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, help="also write the curve here (JSON)")
    parser.add_argument(
        "--loop", type=int, default=0, help="also: N tokens by generate() vs by the loop"
    )
    parser.add_argument(
        "--blocks",
        default="",
        help="also: rows with these caps (e.g. 20,40,60,80,100,174), --batch at a time: "
        "generate() batches (finished rows carried to the end) vs the loop (they leave, "
        "waiting rows join)",
    )
    parser.add_argument("--batch", type=int, default=6, help="rows per batch for --blocks")
    parser.add_argument(
        "--held",
        default="",
        help="also: a pass of N of M rows (N:M[:K],...), the others held back (the pass "
        "scheduler's), against a batch of N rows alone: what holding rows back costs",
    )
    args = parser.parse_args()
    warnings.simplefilter("ignore")

    loaded = load_model(str(args.model), None, args.precision, threads=args.threads)
    model = loaded.model
    print(
        f"{cpu_model()}, torch kernels {torch.backends.cpu.get_cpu_capability()}, "
        f"precision {loaded.precision}, {torch.get_num_threads()} thread(s), "
        f"context {args.context} tokens/row, min of {args.repeat}; load {loadavg()}",
        flush=True,
    )
    processors = greedy_processors(model, MINERU_KWARGS)
    vocab = int(model.lm_head.weight.shape[0]) - 1000
    generator = torch.Generator().manual_seed(0)
    ks = [int(k) for k in args.ks.split(",")]
    print(
        "| rows | K | forward ms | ms per row | vs K=0 | ms per token kept if all accepted | load |"
    )
    print("|---|---|---|---|---|---|---|")
    curve: list[dict[str, object]] = []
    for rows in (int(r) for r in args.rows.split(",")):
        batch = DecodeBatch(model, processors, {-1})
        for _ in range(rows):
            batch.join(0, DecodeRequest(text_prompt(1, args.context, vocab, generator), 1 << 20))
        base = None
        for k in ks:
            best = verify_forward(batch, k, args.repeat, vocab, generator)
            base = base or best
            curve.append(
                {"rows": rows, "k": k, "positions": rows * (k + 1), "seconds": best,
                 "load": loadavg()}
            )  # fmt: skip
            print(
                f"| {rows} | {k} | {best * 1000:.1f} | {best * 1000 / rows:.1f} | "
                f"{best / base:.2f}x | {best * 1000 / rows / (k + 1):.1f} | {loadavg()} |",
                flush=True,
            )
    if args.out:
        header = {"cpu": cpu_model(), "kernels": torch.backends.cpu.get_cpu_capability(),
                  "precision": loaded.precision, "threads": torch.get_num_threads(),
                  "context": args.context, "repeat": args.repeat}  # fmt: skip
        args.out.write_text(json.dumps({**header, "curve": curve}, indent=1), encoding="utf-8")
    if args.held:
        print(f"\nrows held back, context {args.context} (load {loadavg()}):")
        print("| pass | N of M rows, K | held-back pass ms | N rows alone ms | overhead ms |")
        print("|---|---|---|---|---|")
        for spec in args.held.split(","):
            n, m, k = ([int(v) for v in spec.split(":")] + [0])[:3]
            held, alone = held_back(model, processors, n, m, k, args, vocab, generator)
            print(
                f"| {spec} | {n} of {m}, K={k} | {held * 1000:.1f} | {alone * 1000:.1f} | "
                f"{(held - alone) * 1000:.1f} |",
                flush=True,
            )
    if args.loop:
        loop_vs_generate(model, args.context, args.loop, vocab, generator)
    if args.blocks:
        caps = [int(c) for c in args.blocks.split(",")]
        blocks_vs_generate(model, args.context, caps, args.batch, vocab, generator)
    per_position = processor_cost(processors, args.context, vocab, generator)
    print(
        f"\nlogits processors: {per_position * 1000:.2f} ms per scored position (load {loadavg()})"
    )
    return 0


def verify_forward(
    batch: DecodeBatch, k: int, repeat: int, vocab: int, generator: torch.Generator
) -> float:
    """Min seconds of the loop's verify forward with a K-token draft on every row."""
    assert batch.cache is not None and batch.mask is not None
    rows, width = len(batch.rows), k + 1
    ids = torch.randint(0, vocab, (rows, width), generator=generator)
    positions = torch.stack([row.next_pos + torch.arange(width) for row in batch.rows])
    mask = torch.cat([batch.mask, torch.ones((rows, width), dtype=torch.long)], dim=1)
    best = float("inf")
    with torch.no_grad():
        for _ in range(repeat):
            start = time.perf_counter()
            batch.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions.unsqueeze(0).expand(3, -1, -1),
                cache=batch.cache,
                use_cache=True,
            )
            best = min(best, time.perf_counter() - start)
            batch.cache.crop(-width)
    return best


def held_back(
    model: Any,
    processors: LogitsProcessorList,
    n: int,
    m: int,
    k: int,
    args: argparse.Namespace,
    vocab: int,
    generator: torch.Generator,
) -> tuple[float, float]:
    """Min seconds of `DecodeBatch._forward` running `n` of `m` rows (K-token drafts), and
    of the verify forward of a batch of `n` rows alone."""
    batch = DecodeBatch(model, processors, {-1})
    for _ in range(m):
        batch.join(0, DecodeRequest(text_prompt(1, args.context, vocab, generator), 1 << 20))
    assert batch.cache is not None
    taken = list(range(0, m, max(1, m // n)))[:n]
    width = k + 1
    ids = torch.randint(0, vocab, (n, width), generator=generator)
    positions = torch.stack([batch.rows[r].next_pos + torch.arange(width) for r in taken])
    fed = torch.ones((n, width), dtype=torch.long)
    best = float("inf")
    with torch.no_grad():
        for _ in range(args.repeat):
            start = time.perf_counter()
            batch._forward(taken, ids, positions.unsqueeze(0).expand(3, -1, -1), fed)
            best = min(best, time.perf_counter() - start)
            batch.cache.crop(-width)
    alone = DecodeBatch(model, processors, {-1})
    for _ in range(n):
        alone.join(0, DecodeRequest(text_prompt(1, args.context, vocab, generator), 1 << 20))
    return best, verify_forward(alone, k, args.repeat, vocab, generator)


def loop_vs_generate(
    model: object, context: int, tokens: int, vocab: int, generator: torch.Generator
) -> None:
    """One row of `tokens` greedy tokens: generate() against the loop without drafts (its
    own overhead), with the row's own output as the draft (the best case) and with prompt
    lookup (what a row gets for free)."""

    qwen: Any = model  # transformers' generate() is untyped
    kwargs = MINERU_KWARGS
    inputs = text_prompt(1, context, vocab, generator)
    eos = set(qwen.generation_config.eos_token_id or [])
    start = time.perf_counter()
    with torch.no_grad():
        out = qwen.generate(**inputs, max_new_tokens=tokens, **kwargs)
    reference = out[0, context:].tolist()
    rows = [f"| generate() | {time.perf_counter() - start:.2f} s | {len(reference)} | | |"]
    drafts: dict[str, Callable[[], DraftSource | None]] = {
        "loop, no draft": lambda: None,
        "loop, own output as draft": lambda: ExternalDraft(reference),
        "loop, prompt lookup": lambda: PromptLookup(),
    }
    for name, make in drafts.items():
        batch = DecodeBatch(qwen, greedy_processors(qwen, kwargs), eos)
        start = time.perf_counter()
        [result] = decode(batch, [DecodeRequest(inputs, tokens, make())], 1, lambda _r: None)
        seconds = time.perf_counter() - start
        same = (
            "same"
            if result.tokens == reference
            else f"DIFFERENT from {first_diff(result.tokens, reference)}"
        )
        stats = result.stats
        rows.append(
            f"| {name} | {seconds:.2f} s | {len(result.tokens)} {same} | {stats.passes} | "
            f"{stats.accepted}/{stats.proposed} |"
        )
    print(f"\n{tokens} tokens after a {context}-token prompt, one row (load {loadavg()}):")
    print("| decoder | time (prefill included) | tokens | passes | drafts accepted/proposed |")
    print("|---|---|---|---|---|")
    print("\n".join(rows), flush=True)


def blocks_vs_generate(
    model: object,
    context: int,
    caps: list[int],
    size: int,
    vocab: int,
    generator: torch.Generator,
) -> None:
    """Block batches as the engine runs them today (`size` rows per generate(), each row
    stopped at its cap by RowStops, finished rows padded along) against the loop without
    drafts (`size` rows active, a waiting row joins when one leaves)."""

    qwen: Any = model  # transformers' generate() is untyped
    kwargs = MINERU_KWARGS
    inputs = text_prompt(len(caps), context, vocab, generator)
    start = time.perf_counter()
    row_steps = 0
    for first in range(0, len(caps), size):
        part = caps[first : first + size]
        stops = make_row_stops(part, set(), lambda _row: None)
        chunk = {key: value[first : first + size] for key, value in inputs.items()}
        with torch.no_grad():
            qwen.generate(
                **chunk, max_new_tokens=max(part), stopping_criteria=StoppingCriteriaList([stops]),
                **kwargs,
            )  # fmt: skip
        row_steps += len(part) * max(part)
    today = time.perf_counter() - start
    rows = [{key: value[i : i + 1] for key, value in inputs.items()} for i in range(len(caps))]
    batch = DecodeBatch(qwen, greedy_processors(qwen, kwargs), set())
    requests = [DecodeRequest(row, cap) for row, cap in zip(rows, caps, strict=True)]
    start = time.perf_counter()
    decode(batch, requests, size, lambda _r: None)
    loop = time.perf_counter() - start
    print(
        f"\n{len(caps)} rows, caps {caps} ({sum(caps)} tokens) after {context}-token prompts, "
        f"{size} at a time, {batch.passes} loop passes "
        f"(load {loadavg()}):\n| decoder | time (prefill included) | row-steps |\n|---|---|---|\n"
        f"| generate(), RowStops | {today:.2f} s | {row_steps} |\n"
        f"| loop, rows leave | {loop:.2f} s | {sum(caps)} |",
        flush=True,
    )


def first_diff(a: list[int], b: list[int]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def processor_cost(
    processors: LogitsProcessorList, context: int, vocab: int, generator: torch.Generator
) -> float:
    """Min seconds of one call of the processors on a prefix of context + 200 tokens."""
    prefix = torch.randint(0, vocab, (1, context + 200), generator=generator)
    scores = torch.randn((1, vocab + 1000), generator=generator)
    best = float("inf")
    for _ in range(20):
        start = time.perf_counter()
        processors(cast(torch.LongTensor, prefix), scores.clone())
        best = min(best, time.perf_counter() - start)
    return best


if __name__ == "__main__":
    sys.exit(main())
