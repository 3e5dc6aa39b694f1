"""Draft providers for drafted decoding: guesses of a row's next tokens the model only confirms.

A draft costs almost nothing to verify on a CPU (the K+1-token pass reads the weights once, as a
one-token step does) and is never trusted: `decode_loop` keeps only the prefix the model itself
would have written. So a provider may be wrong as often as it likes; it only has to be right
often enough to pay for the few positions a wrong guess wastes (`AdaptiveK` bounds that).

- `PromptLookup`: the row's own output so far (and optionally its prompt): the tokens that
  followed the last earlier occurrence of the row's last few tokens. Layout lines, table tags
  and formulas repeat their own patterns.
- `ExternalDraft`: a text read by someone else (the lite engine's OCR of the same crop, the PDF
  text layer), tokenised with the model's tokenizer and re-aligned as the model writes: after a
  mismatch, the model's last few tokens are looked up in the draft and the draft continues from
  there.

Pure Python on token ids (no torch): the daemon side may build drafts without the model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

# Longest tail (in tokens) matched against the source when looking for where to continue.
NGRAM_MAX = 4
# How far (in draft tokens) a single-token match may be from where the draft was expected.
NEAR = 8


class DraftSource(Protocol):
    """Proposes up to `k` tokens to follow `generated` (the row's output so far, its newest
    token last). May return fewer, or none; is told nothing else: each call re-reads the row."""

    def propose(self, generated: Sequence[int], k: int) -> list[int]: ...


def _find_tail(
    source: Sequence[int], tail: Sequence[int], stop: int, near: int | None = None
) -> int | None:
    """Index in `source` just after an occurrence of `tail` that ends at or before `stop`:
    the one ending closest to `near` (ties to the later) if given, else the last one."""
    n = len(tail)
    best: int | None = None
    first = tail[0]
    for start in range(0, stop - n + 1):
        if source[start] != first or list(source[start : start + n]) != list(tail):
            continue
        end = start + n
        if near is None or best is None or abs(end - near) <= abs(best - near):
            best = end
    return best


@dataclass
class PromptLookup:
    """The continuation of the latest earlier occurrence of the row's last tokens.

    Tries the longest tail first (`ngram_max` tokens) down to `ngram_min`; `prompt` (the row's
    prompt ids, if given) is searched as if it preceded the output."""

    ngram_max: int = NGRAM_MAX
    ngram_min: int = 2
    prompt: Sequence[int] = ()

    def propose(self, generated: Sequence[int], k: int) -> list[int]:
        if k <= 0:
            return []
        text = [*self.prompt, *generated]
        for n in range(min(self.ngram_max, len(generated)), self.ngram_min - 1, -1):
            # The tail's own occurrence (ending at len(text)) would propose nothing.
            end = _find_tail(text, text[-n:], len(text) - 1)
            if end is not None:
                return text[end : end + k]
        return []


class ExternalDraft:
    """A draft text already tokenised with the model's tokenizer, followed as the model writes.

    `cursor` is where the draft is believed to continue. After each call it is moved to the
    occurrence of the output's last tokens nearest to where it was, so a skipped or extra word
    costs a few positions and the draft picks up again behind it.
    """

    def __init__(self, tokens: Sequence[int], ngram_max: int = NGRAM_MAX) -> None:
        self.tokens = list(tokens)
        self.ngram_max = ngram_max
        self.cursor = 0
        self.seen = 0  # len(generated) at the last call

    @classmethod
    def from_text(cls, text: str, encode: Callable[[str], list[int]]) -> ExternalDraft:
        """A text someone else read (OCR lines in reading order, a text layer), tokenised
        by `encode`: the model's tokenizer without special tokens, so the ids are the ones
        the model writes."""
        return cls(encode(text))

    def propose(self, generated: Sequence[int], k: int) -> list[int]:
        if not generated:
            self.cursor = 0
        elif self._follows(generated):
            # The model wrote what the draft said since the last call: no search needed.
            self.cursor += len(generated) - self.seen
        else:
            self.cursor = self._realign(generated)
        self.seen = len(generated)
        if k <= 0 or self.cursor < 0:
            return []
        return self.tokens[self.cursor : self.cursor + k]

    def _follows(self, generated: Sequence[int]) -> bool:
        new = list(generated[self.seen :])
        start = self.cursor
        return (
            self.cursor >= 0
            and len(generated) > self.seen
            and self.tokens[start : start + len(new)] == new
        )

    def _realign(self, generated: Sequence[int]) -> int:
        """Where the draft continues after the output's last tokens; -1 if nowhere.

        A tail of 2+ tokens anywhere (the occurrence nearest to where the draft would be had
        it kept in step); else the last token alone, if it occurs close by; else in step, as
        if the draft had the wrong tokens in place of the right ones (an OCR substitution)."""
        near = self.cursor + len(generated) - self.seen if self.cursor >= 0 else -1
        for n in range(min(self.ngram_max, len(generated)), 1, -1):
            end = _find_tail(self.tokens, generated[-n:], len(self.tokens), max(near, 0))
            if end is not None:
                return end
        end = _find_tail(self.tokens, generated[-1:], len(self.tokens), max(near, 0))
        if end is not None and (near < 0 or abs(end - near) <= NEAR):
            return end
        return near if 0 <= near < len(self.tokens) else -1


@dataclass
class AdaptiveK:
    """A row's draft length, following its recent acceptance.

    Doubles after a fully accepted draft (up to `k_max`), halves after a partial one (not
    below what was accepted + 1), halves after a rejected one, and after `patience` rejections
    in a row drops to 0 for `cooldown` passes, then tries one token again, resting again at
    its next rejection: a useless draft source costs a position now and then, never a growing
    share of the work.

    While resting it still watches (`watching`): the loop asks the source for one token it
    does not score, and `observe` hears whether the model then wrote it. `wake` agreements in
    a row end the rest at K = `k_wake`: after a garbled OCR line the re-aligned draft agrees
    again within a pass or two of the next good line, which a blind rest would sleep through
    (docs/benchmarks.md, "AdaptiveK tuned by replay"). 0: never wakes early.
    Resting passes score nothing, so the watch is free: it only calls the source.
    """

    # Tuned by replaying the loop on a trained decoder's recorded output (bench/draft_replay.py,
    # docs/benchmarks.md): waking on the first agreement, straight to k_max, gets closest to a
    # fixed K = 12 on OCR drafts, and the long rest (ended early by the watch) costs a useless
    # draft fewer positions than the blind 16-pass one did.
    k_max: int = 12
    k: int = 4
    patience: int = 2
    cooldown: int = 64
    wake: int = 1
    k_wake: int = 12
    failures: int = 0
    resting: int = 0
    agreements: int = 0

    def current(self) -> int:
        if self.resting > 0:
            self.resting -= 1
            return 0
        return self.k

    def watching(self) -> bool:
        """Whether a draft token is worth looking at (not scoring) in this resting pass."""
        return self.wake > 0 and self.resting > 0

    def observe(self, agreed: bool) -> None:
        """While resting: whether the draft's next token was the one the model wrote."""
        self.agreements = self.agreements + 1 if agreed else 0
        if self.wake and self.agreements >= self.wake:
            self.agreements = 0
            self.resting = 0
            self.failures = 0
            self.k = min(self.k_max, max(1, self.k_wake))

    def update(self, proposed: int, accepted: int) -> None:
        if proposed == 0:
            return
        self.agreements = 0
        if accepted == proposed:
            self.failures = 0
            self.k = min(self.k_max, max(1, self.k) * 2)
        elif accepted > 0:
            self.failures = 0
            self.k = min(self.k_max, max(accepted + 1, self.k // 2))
        else:
            self.failures += 1
            self.k = max(1, self.k // 2)
            if self.failures >= self.patience:
                self.failures = self.patience - 1
                self.resting = self.cooldown
                self.k = 1


@dataclass(frozen=True)
class DraftPlan:
    """What one pass does with a row's draft: `tokens` are scored; `watched` (while the
    policy rests) is only compared with what the model writes, at no cost."""

    tokens: list[int]
    watched: list[int]


def plan_draft(
    source: DraftSource | None, policy: AdaptiveK, generated: Sequence[int], room: int
) -> DraftPlan:
    """A row's draft for its next pass: up to the policy's K tokens, at most `room` (the
    pass writes draft + 1 tokens: the draft never runs past the row's cap)."""
    k = min(policy.current(), room)
    if source is None or room <= 0:
        return DraftPlan([], [])
    if k > 0:
        return DraftPlan(list(source.propose(generated, k))[:k], [])
    if policy.watching():
        return DraftPlan([], list(source.propose(generated, 1))[:1])
    return DraftPlan([], [])


def settle_draft(policy: AdaptiveK, plan: DraftPlan, written: Sequence[int]) -> int:
    """Tell the policy how `plan` fared against the tokens the pass `written` (the accepted
    draft prefix, then the model's own token); how many draft tokens were accepted."""
    accepted = 0
    for drafted, token in zip(plan.tokens, written, strict=False):
        if drafted != token:
            break
        accepted += 1
    if plan.watched and written:
        policy.observe(plan.watched[0] == written[0])
    policy.update(len(plan.tokens), accepted)
    return accepted
