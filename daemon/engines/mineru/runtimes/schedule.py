"""Which rows a decode pass runs, and how long each row's draft is: tokens per second.

A pass of the decode loop scores rows x (1 + K) positions (every row padded to the longest
draft). What that costs depends on the decoder's kernels, and not linearly: the weight-only
int8 decoder's kernel is a matrix-vector kernel (its cost grows with positions up to
`int8_linear.DENSE_ROWS`, then it dequantises and runs a dense GEMM whose cost grows slowly),
dense decoders read their weights once per pass whatever the positions. A pass of 8 rows
without drafts writes 8 tokens; 2 rows with good drafts of 4 may write 9 for fewer
positions. So each pass `PassScheduler.choose` picks the rows and the width (1 + K) with
the most expected tokens per second, from

- the measured pass cost by rows and width (`PassCost`, a table per CPU class);
- each row's recent acceptance (`Acceptance`: a draft token is taken as accepted with
  probability `rate`, independently, so K tokens write 1 + a + ... + a^K on average) and
  the draft it has for this pass (no more than that is scored).

A row left out of a pass waits (its draft is kept for the next): no token changes, the
output is still the model's greedy output. No row waits more than `max_wait` passes in a
row: a row whose drafts are useless is not starved by the ones whose drafts are good.

Pure Python (no torch): the replay (bench/sched_replay.py) runs the same choices.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from daemon.engines.mineru.runtimes.drafts import (
    AdaptiveK,
    DraftPlan,
    DraftSource,
    plan_draft,
    settle_draft,
)


@dataclass(frozen=True)
class PassCost:
    """Seconds of one decode pass of `rows` rows x `width` positions, from measured points
    (rows, width, seconds): interpolated linearly in rows between the measured row counts
    and in width between the measured widths; beyond the widths, along the last two points'
    line; beyond the row counts, in proportion to the nearest.

    A pass crossing `dense_from` positions (rows x width) changes kernels (the int8 decoder
    dequantises and runs a dense GEMM from there): points on the other side are not
    interpolated across, so the jump stays where it is."""

    points: tuple[tuple[int, int, float], ...]
    dense_from: int = 0  # 0: one kernel for every size

    def seconds(self, rows: int, width: int) -> float:
        table = self._side(rows * width)
        counts = sorted({r for r, _w, _s in table})
        low = max((r for r in counts if r <= rows), default=counts[0])
        high = min((r for r in counts if r >= rows), default=counts[-1])
        at_low = self._along_width(table, low, width)
        if high == low:  # measured, or outside the measured row counts: in proportion
            return at_low * rows / low
        at_high = self._along_width(table, high, width)
        return at_low + (at_high - at_low) * (rows - low) / (high - low)

    def _side(self, positions: int) -> list[tuple[int, int, float]]:
        """The points measured on the same side of `dense_from` as `positions` (all points
        when that side has none)."""
        if not self.dense_from:
            return list(self.points)
        dense = positions >= self.dense_from
        side = [p for p in self.points if (p[0] * p[1] >= self.dense_from) == dense]
        return side or list(self.points)

    @staticmethod
    def _along_width(table: Sequence[tuple[int, int, float]], rows: int, width: int) -> float:
        row = sorted((w, s) for r, w, s in table if r == rows)  # `rows` has points here
        lower = [(w, s) for w, s in row if w <= width]
        upper = [(w, s) for w, s in row if w >= width]
        if lower and upper:
            (w0, s0), (w1, s1) = lower[-1], upper[0]
            return s0 if w1 == w0 else s0 + (s1 - s0) * (width - w0) / (w1 - w0)
        # Outside the measured widths: along the nearest two points' line (never below 0),
        # in proportion to the one point if there is only one.
        near = row[-2:] if lower else row[:2]
        if len(near) < 2:
            return near[0][1] * width / near[0][0]
        (w0, s0), (w1, s1) = near
        return max(s1 + (s1 - s0) * (width - w1) / (w1 - w0), 0.0)


@dataclass
class Acceptance:
    """A row's recent share of drafted tokens the model confirmed, as a per-token
    probability: each scored draft is `accepted` hits and, unless fully accepted, one miss
    (the token refused), with older drafts weighing `decay` times less at each new one.
    Starts at `prior` with the weight of `weight` tokens."""

    prior: float = 0.5
    weight: float = 2.0
    decay: float = 0.5
    hits: float = field(init=False)
    misses: float = field(init=False)

    def __post_init__(self) -> None:
        self.hits = self.prior * self.weight
        self.misses = (1.0 - self.prior) * self.weight

    @property
    def rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total > 0 else self.prior

    def update(self, proposed: int, accepted: int) -> None:
        if proposed <= 0:
            return
        self.hits = self.hits * self.decay + accepted
        self.misses = self.misses * self.decay + (1 if accepted < proposed else 0)


@dataclass(frozen=True)
class Candidate:
    """A row that could take part in the next pass."""

    drafted: int  # draft tokens it has for this pass (the most it may score)
    rate: float  # Acceptance.rate
    waited: int  # passes it has sat out in a row


def expected_tokens(rate: float, k: int) -> float:
    """Tokens a pass writes for a row scoring a k-token draft: the model's own token, plus
    each draft token while every one before it was accepted (1 + a + ... + a^k)."""
    rate = min(max(rate, 0.0), 1.0)
    return float(k + 1) if rate >= 1.0 else (1.0 - rate ** (k + 1)) / (1.0 - rate)


@dataclass(frozen=True)
class PassScheduler:
    """Chooses each pass's rows and draft lengths (see the module docstring).

    `k_max` caps a draft; `max_wait` is the most passes in a row a row sits out; `held`
    the seconds a pass that leaves rows out pays on top (DecodeBatch copies the cache rows
    it runs). A pass takes at least one row."""

    cost: PassCost
    k_max: int = 8
    max_wait: int = 2
    held: float = 0.0

    def choose(self, rows: Sequence[Candidate]) -> list[int]:
        """Each row's K for this pass, -1 for a row that waits."""
        if not rows:
            return []
        forced = [i for i, row in enumerate(rows) if row.waited >= self.max_wait]
        longest = min(self.k_max, max(row.drafted for row in rows))
        best: tuple[float, int, int] | None = None  # (tokens per second, rows, width)
        best_rows: list[int] = []
        for width in range(1, longest + 2):
            value = [expected_tokens(row.rate, min(row.drafted, width - 1)) for row in rows]
            others = sorted(
                (i for i in range(len(rows)) if i not in forced), key=lambda i: -value[i]
            )
            chosen = list(forced)
            tokens = sum(value[i] for i in chosen)
            for i in [None, *others]:
                if i is not None:
                    chosen.append(i)
                    tokens += value[i]
                if not chosen:
                    continue
                extra = self.held if len(chosen) < len(rows) else 0.0
                rate = tokens / max(self.cost.seconds(len(chosen), width) + extra, 1e-9)
                # Ties go to more rows (less waiting), then to the narrower pass.
                key = (rate, len(chosen), -width)
                if best is None or key > best:
                    best, best_rows = key, list(chosen)
        assert best is not None
        width = -best[2]
        picked = set(best_rows)
        return [min(row.drafted, width - 1) if i in picked else -1 for i, row in enumerate(rows)]


@dataclass
class RowDrafts:
    """A row's draft bookkeeping across passes: its source and K policy, its acceptance,
    the draft planned for it and not yet scored (it waited), the passes it sat out, and
    the next draft token the scheduler cut off this pass (`unscored`: compared, not scored,
    with what the model writes after the accepted ones)."""

    source: DraftSource | None
    policy: AdaptiveK
    acceptance: Acceptance = field(default_factory=Acceptance)
    pending: DraftPlan | None = None
    waited: int = 0
    unscored: list[int] = field(default_factory=list)


def plan_pass(
    rows: Sequence[RowDrafts],
    generated: Sequence[Sequence[int]],
    rooms: Sequence[int],
    scheduler: PassScheduler | None,
    limit: int,
) -> list[DraftPlan | None]:
    """Each row's draft for the next pass; None for a row that sits it out.

    Without a scheduler every row runs, its draft cut to `limit` (the batch's positions per
    row less one). With one, a row's draft is planned once (up to its policy's K and its
    `room`) and kept while it waits, and the scheduler picks the rows and cuts the drafts."""
    if scheduler is None:
        return [
            plan_draft(row.source, row.policy, made, min(room, limit))
            for row, made, room in zip(rows, generated, rooms, strict=True)
        ]
    plans: list[DraftPlan] = []
    for row, made, room in zip(rows, generated, rooms, strict=True):
        if row.pending is None:
            row.pending = plan_draft(row.source, row.policy, made, room)
        plans.append(row.pending)
    ks = scheduler.choose(
        [
            Candidate(len(plan.tokens), row.acceptance.rate, row.waited)
            for row, plan in zip(rows, plans, strict=True)
        ]
    )
    out: list[DraftPlan | None] = []
    for row, plan, k in zip(rows, plans, ks, strict=True):
        if k < 0:
            row.waited += 1
            out.append(None)
            continue
        row.waited = 0
        row.pending = None
        row.unscored = plan.tokens[k : k + 1]
        out.append(DraftPlan(plan.tokens[:k], plan.watched))
    return out


def settle_row(row: RowDrafts, plan: DraftPlan, written: Sequence[int]) -> int:
    """`settle_draft` for the row's policy, and its acceptance told; the tokens accepted.

    The acceptance also hears the draft token the scheduler cut off, where the model wrote
    the token at its place: a row scored with K = 0 because its acceptance looked poor
    would otherwise never show that its draft has become good (free: nothing scored)."""
    accepted = settle_draft(row.policy, plan, written)
    proposed, agreed = len(plan.tokens), accepted
    if accepted == proposed and row.unscored and len(written) > accepted:
        proposed += 1
        agreed += int(row.unscored[0] == written[accepted])
    row.unscored = []
    row.acceptance.update(proposed, agreed)
    return accepted
