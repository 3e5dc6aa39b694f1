"""An ESTIMATE, not a measurement: what prompt-lookup drafting would save on the layout step.

MinerU2.5's layout step writes one line per block, `<|box_start|>x0 y0 x1 y1<|box_end|>
<|ref_start|>type<|ref_end|><|rotate_up|>` + newline: about 22 tokens, of which the digits
(12) and the type cannot be guessed, and the separators can. Speculative decoding with
drafts looked up in the text generated so far (transformers' `generate(...,
prompt_lookup_num_tokens=k, max_matching_ngram_size=n)`; greedy output unchanged) verifies
the drafted tokens in one forward pass of k+1 positions, which costs more than a one-token
step and saves the steps of every accepted token.

Its gain depends on what the trained model writes, so the random-weight benches cannot show
it (their tokens are noise). Here it is estimated from real layout strings: the realistic
page's (bench/realistic.py, tokenised with Qwen2's BPE) and, when the shared golden set is
next to the checkout, the layout answers of its canned model outputs. Drafting follows
transformers' rule (the longest matching n-gram up to n, its earliest occurrence, up to k
tokens after it); a forward pass of r positions costs what `--step-ms` says a decode step of
r rows costs (bench/bench_decoder_steps.py, linear in between). Not modelled: that r
positions of one sequence are not quite r rows of separate ones (attention), and the
candidate generator's own time.

    python bench/draft_estimate.py --step-ms 1:53.7,4:67.3,8:97.4,16:143.7   # AMX, int8
    python bench/draft_estimate.py --step-ms 1:55.1,4:92.8,8:134.0,16:207.3  # AVX2, all caps
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import realistic

# Beside the corpus realistic.py reads (DOCINBOX_CORPUS moves both): shared/golden/...
GOLDEN = realistic.CORPUS.parent.parent / "golden" / "mineru-4.0.12"


def parse_costs(text: str) -> list[tuple[int, float]]:
    points = sorted((int(r), float(ms)) for r, ms in (p.split(":") for p in text.split(",")))
    if not points or points[0][0] != 1:
        raise SystemExit("--step-ms needs the cost of 1 row (1:MS,...)")
    return points


def step_ms(points: list[tuple[int, float]], rows: int) -> float:
    """Linear between the measured row counts; the last slope beyond them."""
    for (r0, c0), (r1, c1) in itertools.pairwise(points):
        if rows <= r1:
            return c0 + (c1 - c0) * (rows - r0) / (r1 - r0)
    if len(points) == 1:
        return points[0][1]
    (r0, c0), (r1, c1) = points[-2], points[-1]
    return c1 + (c1 - c0) * (rows - r1) / (r1 - r0)


def draft(history: list[bytes], k: int, n: int) -> list[bytes]:
    """transformers' PromptLookupCandidateGenerator: the longest n-gram first, its earliest
    occurrence with a continuation, up to k tokens of it."""
    for size in range(min(n, len(history) - 1), 0, -1):
        tail = history[-size:]
        for start in range(len(history) - size):
            if history[start : start + size] == tail:
                stop = min(start + size + k, len(history))
                if start + size < stop:
                    return history[start + size : stop]
    return []


def simulate(
    tokens: list[bytes], k: int, n: int, costs: list[tuple[int, float]]
) -> tuple[int, float]:
    """(forward passes, milliseconds) to write `tokens` greedily with drafts; the first token
    comes from the prefill, as in generate()."""
    done, passes, ms = 1, 0, 0.0
    while done < len(tokens):
        proposal = draft(tokens[:done], k, n)
        accepted = 0
        while (
            accepted < len(proposal)
            and done + accepted < len(tokens)
            and tokens[done + accepted] == proposal[accepted]
        ):
            accepted += 1
        passes += 1
        ms += step_ms(costs, len(proposal) + 1)
        done += accepted + 1  # the accepted drafts and the model's own next token
    return passes, ms


def layouts(count: realistic.QwenCounter) -> list[tuple[str, str]]:
    pdf, idx = realistic.DEFAULT_PAGE
    plan = realistic.page_plan(pdf, idx, count)
    found = [(f"{pdf.name} p{idx + 1} (realistic page)", plan.layout)]
    for path in sorted(GOLDEN.glob("*/*/canned_model_output.json")):
        for page in json.loads(path.read_text(encoding="utf-8"))["pages"]:
            text = page.get("vlm_layout_raw_output")
            if text and text not in {t for _n, t in found}:
                found.append((f"{path.parent.parent.name} p{page['page_no']} (golden)", text))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--step-ms", required=True, help="ROWS:MS,... of one decode step")
    parser.add_argument("--drafts", default="1,2,3,4", help="k values: tokens drafted at most")
    parser.add_argument("--ngram", type=int, default=2, help="n: longest n-gram matched")
    args = parser.parse_args()
    costs = parse_costs(args.step_ms)
    cache = Path("~/.cache/docinbox-bench").expanduser()
    count = realistic.counter(cache / "mineru2.5-shape", cache / "qwen-tokenizer")
    if not isinstance(count, realistic.QwenCounter):
        raise SystemExit("needs Qwen2's BPE ranks (the dashscope wheel, fetched by pip)")
    strings = [(name, [*count.tokens(text), b"<|im_end|>"]) for name, text in layouts(count)]
    print(f"step costs (ms by rows): {costs}; n-gram up to {args.ngram}")
    print(
        "| layout string | tokens | k | forward passes | estimated ms | one token per step "
        "| speed-up |"
    )
    print("|---|---|---|---|---|---|---|")
    for k in (int(v) for v in args.drafts.split(",")):
        total_plain = total_drafted = 0.0
        for name, tokens in strings:
            passes, ms = simulate(tokens, k, args.ngram, costs)
            plain = (len(tokens) - 1) * step_ms(costs, 1)
            total_plain, total_drafted = total_plain + plain, total_drafted + ms
            print(
                f"| {name} | {len(tokens)} | {k} | {passes} | {ms:,.0f} | {plain:,.0f} "
                f"| {plain / ms:.2f}× |"
            )
        print(f"| all {len(strings)} | | {k} | | {total_drafted:,.0f} | {total_plain:,.0f} "
              f"| **{total_plain / total_drafted:.2f}×** |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
