"""The draft length policy tuned without the model: the loop's passes replayed on recorded tokens.

Whether a drafted position is accepted depends only on the model's greedy output (fixed: the
loop is lossless) and on the draft, never on K. So once a row's output is recorded, the decode
loop's bookkeeping (`plan_draft` / `settle_draft`, which `DecodeBatch` itself runs, with the
`DraftSource` and `AdaptiveK` of drafts.py) can be replayed against it for any policy, in
milliseconds: the passes it would take and the positions it would waste.

- `--record FILE` (once, ~3 min): the samples of bench/draft_acceptance.py scanned and read by
  the lite engine's OCR, Qwen2.5-Coder-0.5B's greedy copy of each (the trained GGUF at
  ~/.cache/docinbox-bench/qwen2.5-coder-0.5b-instruct-q4_k_m, fp32), and the draft tokens;
- then every policy of `POLICIES` over every (sample, draft): the source text, the OCR
  readings, prompt lookup and two useless drafts (random tokens, and another sample's text
  in another language). Reported: passes per token by draft CER bucket, and the positions
  scored and not accepted ("wasted") on the useless drafts.

    python bench/draft_replay.py --record replay.json          # records if the file is missing
    python bench/draft_replay.py --record replay.json --policies now,k12,tuned
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.draft_acceptance import (
    SCANS,
    cer_bucket,
    cer_over,
    fixed_k,
    reading_truth,
    samples,
    written_share,
)
from daemon.engines.mineru.runtimes.drafts import (
    AdaptiveK,
    DraftSource,
    ExternalDraft,
    PromptLookup,
    plan_draft,
    settle_draft,
)

DEFAULT_SAMPLES = "english-1,german-1,html-table,latex-1"
# Another language for each sample's useless draft: a text the model is not copying.
OTHER = {"english-1": "german-1", "german-1": "english-1"}


@dataclass
class RecordedDraft:
    name: str  # source | ocr <scan>
    tokens: list[int]
    cer: float | None  # over the part of the block the row wrote (None: not a reading)


@dataclass
class Recorded:
    name: str
    kind: str
    output: list[int]  # the model's greedy tokens (the loop writes the same)
    cap: int  # the row's max_new_tokens (the loop's drafts never run past it)
    drafts: list[RecordedDraft] = field(default_factory=list)


@dataclass(frozen=True)
class Replay:
    tokens: int
    passes: int  # the prefill included, as DecodeBatch counts
    proposed: int
    accepted: int

    @property
    def wasted(self) -> int:
        return self.proposed - self.accepted


def replay(
    output: Sequence[int],
    cap: int,
    source: DraftSource | None,
    policy: AdaptiveK,
    limit: int = 1 << 30,
) -> Replay:
    """The passes `DecodeBatch` takes for a row alone that writes `output` (its prefill writes
    the first token; every pass after it scores the planned draft, keeps the accepted prefix
    and the model's next token). `limit`: the batch's positions per row less one."""
    generated = [output[0]]
    passes, proposed, accepted = 1, 0, 0
    while len(generated) < len(output):
        room = min(cap - len(generated) - 1, limit)
        plan = plan_draft(source, policy, generated, room)
        written: list[int] = []
        for j in range(len(plan.tokens) + 1):
            written.append(output[len(generated) + len(written)])
            if len(generated) + len(written) >= len(output):
                break
            if j >= len(plan.tokens) or written[-1] != plan.tokens[j]:
                break
        generated += written
        passes += 1
        proposed += len(plan.tokens)
        accepted += settle_draft(policy, plan, written)
    return Replay(len(output), passes, proposed, accepted)


# --- policies ------------------------------------------------------------------------------

POLICIES: dict[str, Callable[[], AdaptiveK]] = {
    # AdaptiveK before this tuning: rests 16 passes after 3 rejections, blind while resting.
    "old": lambda: AdaptiveK(k_max=12, k=4, patience=3, cooldown=16, wake=0),
    "k12": fixed_k(12),
    "k4": fixed_k(4),
    # Shorter blind rests.
    "rest4": lambda: AdaptiveK(k_max=12, k=4, patience=3, cooldown=4, wake=0),
    "rest8": lambda: AdaptiveK(k_max=12, k=4, patience=3, cooldown=8, wake=0),
    # Rests that end when the watched draft agrees again (2 agreements, back at K = 4).
    "wake2": lambda: AdaptiveK(k_max=12, k=4, patience=3, cooldown=16, wake=2, k_wake=4),
    "wake1-p3": lambda: AdaptiveK(k_max=12, k=4, patience=3, cooldown=64, wake=1, k_wake=8),
    "now": AdaptiveK,  # the shipped defaults (k_max 12 as DENSE_DRAFTS)
}


# --- recording (the model) -----------------------------------------------------------------


def record(path: Path, names: Sequence[str], cap: int, threads: int) -> None:
    import torch

    from bench.draft_acceptance import greedy, read_samples
    from bench.fidelity import Prompt, load, prompt_ids, qwen2, stop_ids

    torch.set_num_threads(threads)
    chosen = [s for s in samples() if s.name in names]
    scans = [s for s in SCANS if s.name in ("300dpi", "250dpi", "200dpi-poor")]
    readings = read_samples(chosen, scans, threads, print)
    causal, tokenizer = load(qwen2())
    causal.generation_config.eos_token_id = sorted(stop_ids(tokenizer))
    out: list[Recorded] = []
    for sample in chosen:
        ids = torch.tensor([prompt_ids(tokenizer, Prompt(sample.name, sample.source))])
        run = greedy(causal, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, cap)
        print(f"  {sample.name}: {len(run.tokens)} tokens in {run.seconds:.1f} s")
        source = list(tokenizer.encode(sample.source, add_special_tokens=False))
        share = written_share(len(run.tokens), source)
        row = Recorded(
            sample.name, sample.kind, run.tokens, cap, [RecordedDraft("source", source, 0.0)]
        )
        for scan, text in readings[sample.name].texts.items():
            within = round(cer_over(text, reading_truth(sample), share), 4)
            tokens = list(tokenizer.encode(text, add_special_tokens=False))
            row.drafts.append(RecordedDraft(f"ocr {scan}", tokens, within))
        out.append(row)
    path.write_text(json.dumps([asdict(r) for r in out]), encoding="utf-8")


def load_recorded(path: Path) -> list[Recorded]:
    rows = json.loads(path.read_text(encoding="utf-8"))
    return [
        Recorded(
            r["name"], r["kind"], r["output"], r["cap"],
            [RecordedDraft(**d) for d in r["drafts"]],
        )
        for r in rows
    ]


# --- the replay ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    sample: str
    bucket: str  # OCR <CER bucket> | source | prompt lookup | random | other language
    output: list[int]
    cap: int
    make: Callable[[], DraftSource | None]


def external(tokens: Sequence[int]) -> Callable[[], DraftSource | None]:
    return lambda: ExternalDraft(tokens)


def cases(recorded: Sequence[Recorded], seed: int = 0) -> list[Case]:
    by_name = {r.name: r for r in recorded}
    rng = random.Random(seed)
    vocab = max(t for r in recorded for t in r.output) + 1
    out: list[Case] = []
    for r in recorded:
        for d in r.drafts:
            tokens = d.tokens
            kind = "paragraph" if r.kind in ("english", "german") else r.kind
            read = "source" if d.name == "source" else f"OCR {cer_bucket(d.cer or 0.0)}"
            bucket = f"{kind}, {read}"
            out.append(Case(r.name, bucket, r.output, r.cap, external(tokens)))
        out.append(Case(r.name, "prompt lookup", r.output, r.cap, PromptLookup))
        noise = [rng.randrange(vocab) for _ in r.drafts[0].tokens]
        out.append(Case(r.name, "random tokens", r.output, r.cap, external(noise)))
        other = by_name.get(OTHER.get(r.name, ""))
        if other is not None:
            text = other.drafts[0].tokens
            out.append(
                Case(r.name, "other language", r.output, r.cap, external(text))
            )
    return out


def table(recorded: Sequence[Recorded], chosen: Sequence[str]) -> str:
    results: dict[tuple[str, str], list[Replay]] = {}
    order: list[str] = []
    for case in cases(recorded):
        if case.bucket not in order:
            order.append(case.bucket)
        for name in chosen:
            run = replay(case.output, case.cap, case.make(), POLICIES[name]())
            results.setdefault((case.bucket, name), []).append(run)
    head = "| draft | runs | tokens | " + " | ".join(chosen) + " |"
    lines = [
        "passes per token (greedy 1.000; wasted = positions scored and not accepted)",
        head,
        "|" + "---|" * (3 + len(chosen)),
    ]
    for bucket in order:
        first = results[(bucket, chosen[0])]
        cells = []
        for name in chosen:
            runs = results[(bucket, name)]
            tokens = sum(r.tokens for r in runs)
            ppt = sum(r.passes for r in runs) / tokens
            cells.append(f"{ppt:.3f} ({sum(r.wasted for r in runs)} wasted)")
        tokens = sum(r.tokens for r in first)
        lines.append(f"| {bucket} | {len(first)} | {tokens} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", type=Path, required=True, help="recorded tokens (JSON)")
    parser.add_argument("--samples", default=DEFAULT_SAMPLES)
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--max-new", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    if not args.record.is_file():
        record(args.record, args.samples.split(","), args.max_new, args.threads)
    print(table(load_recorded(args.record), args.policies.split(",")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
