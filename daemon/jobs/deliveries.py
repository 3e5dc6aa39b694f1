"""Events and their deliveries (hooks): the transactional outbox's tables.

An event is written in the transaction that records the outcome it tells of, with one
delivery row per receiver; a delivery thread per receiver works the rows off.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from daemon.jobs.db import Database


@dataclass(frozen=True)
class NewEvent:
    """An event to record with the outcome, in the same transaction, and who gets it."""

    id: str  # unique; the receiver's deduplication key (webhook-id)
    type: str
    job_id: int  # the job whose outcome it tells of
    created_at: float  # wall clock
    body: str  # the JSON receivers get, byte for byte (signed as is)
    receivers: tuple[str, ...]  # hook names subscribed to this type



def record_event(c: sqlite3.Connection, job_id: int, ev: NewEvent) -> None:
    """An event and its deliveries, in the caller's transaction (the outcome's)."""
    if ev.job_id != job_id:
        raise ValueError(f"the event {ev.id} tells of job {ev.job_id}, not of job {job_id}")
    if not ev.receivers:
        return
    seq = c.execute(
        "INSERT INTO events(id, type, job_id, created_at, body) VALUES(?, ?, ?, ?, ?)",
        (ev.id, ev.type, job_id, ev.created_at, ev.body),
    ).lastrowid
    c.executemany(
        "INSERT INTO deliveries(event_seq, receiver, state, next_at, since)"
        " VALUES(?, ?, ?, ?, ?)",
        [(seq, r, "pending", ev.created_at, ev.created_at) for r in ev.receivers],
    )


DeliveryState = Literal["pending", "delivered", "dead"]


@dataclass(frozen=True)
class Delivery:
    """One event for one receiver, and how its delivery stands."""

    seq: int  # the event's place in the order events happened
    event_id: str
    type: str
    job_id: int | None
    created_at: float
    body: str
    receiver: str
    state: DeliveryState
    attempts: int
    next_at: float
    since: float  # when it became due: its age counts from here (a retry resets it)
    last_error: str | None
    finished_at: float | None

    @classmethod
    def from_row(cls, r: sqlite3.Row) -> Delivery:
        return cls(
            seq=int(r["seq"]), event_id=r["id"], type=r["type"], job_id=r["job_id"],
            created_at=float(r["created_at"]), body=r["body"], receiver=r["receiver"],
            state=r["state"], attempts=int(r["attempts"]), next_at=float(r["next_at"]),
            since=float(r["since"]), last_error=r["last_error"], finished_at=r["finished_at"],
        )


@dataclass(frozen=True)
class ReceiverCounts:
    receiver: str
    pending: int
    dead: int
    oldest_pending_at: float | None
    last_error: str | None  # of its oldest pending delivery (the one being retried)



class EventRecords(Database):
    _DELIVERY_SELECT = (
        "SELECT events.*, d.receiver, d.state, d.attempts, d.next_at, d.since, d.last_error, "
        "d.finished_at FROM deliveries d JOIN events ON events.seq = d.event_seq"
    )

    def next_delivery(self, receiver: str) -> Delivery | None:
        """The receiver's oldest pending delivery: per receiver, events go in order."""
        row = self.conn.execute(
            self._DELIVERY_SELECT + " WHERE d.state = 'pending' AND d.receiver = ? "
            "ORDER BY d.event_seq LIMIT 1",
            (receiver,),
        ).fetchone()
        return Delivery.from_row(row) if row else None

    def delivery_succeeded(self, d: Delivery, now: float) -> None:
        with self.tx() as c:
            c.execute(
                "UPDATE deliveries SET state = 'delivered', attempts = attempts + 1, "
                "finished_at = ?, last_error = NULL WHERE receiver = ? AND event_seq = ?",
                (now, d.receiver, d.seq),
            )
            self._bump(c, "hook_deliveries_total")

    def delivery_failed(self, d: Delivery, now: float, error: str, next_at: float | None) -> None:
        """A failed attempt: tried again at `next_at`, or (None) given up: dead."""
        with self.tx() as c:
            c.execute(
                "UPDATE deliveries SET attempts = attempts + 1, last_error = ?, next_at = ?, "
                "state = ?, finished_at = ? WHERE receiver = ? AND event_seq = ?",
                (error, next_at if next_at is not None else now,
                 "pending" if next_at is not None else "dead",
                 None if next_at is not None else now, d.receiver, d.seq),
            )
            self._bump(c, "hook_attempts_failed_total")
            if next_at is None:
                self._bump(c, "hook_deliveries_dead_total")

    def expire_deliveries_of_others(self, receivers: Sequence[str], now: float) -> int:
        """Pending deliveries to receivers no longer configured become dead (reported,
        and re-queued by `docinbox hooks retry --dead` once the receiver is back)."""
        marks = ",".join("?" * len(receivers))
        where = "state = 'pending'" + (f" AND receiver NOT IN ({marks})" if receivers else "")
        with self.tx() as c:
            n = c.execute(
                "UPDATE deliveries SET state = 'dead', finished_at = ?, last_error = "
                "'its receiver is no longer in the configuration' WHERE " + where,
                (now, *receivers),
            ).rowcount
            if n:
                self._bump(c, "hook_deliveries_dead_total", n)
            return int(n)

    def deliveries(
        self, states: Sequence[DeliveryState] = ("pending", "dead"), limit: int = 1000
    ) -> list[Delivery]:
        """Deliveries in `states`, oldest event first."""
        marks = ",".join("?" * len(states))
        rows = self.conn.execute(
            self._DELIVERY_SELECT + f" WHERE d.state IN ({marks}) "
            "ORDER BY d.event_seq, d.receiver LIMIT ?",
            (*states, limit),
        ).fetchall()
        return [Delivery.from_row(r) for r in rows]

    def event(self, key: str) -> tuple[int, str] | None:
        """(seq, id) of the event with this id or sequence number."""
        row = self.conn.execute(
            "SELECT seq, id FROM events WHERE id = ? OR seq = ?",
            (key, int(key) if key.isdigit() else -1),
        ).fetchone()
        return (int(row[0]), str(row[1])) if row else None

    def requeue_deliveries(self, now: float, seq: int | None = None) -> int:
        """`docinbox hooks retry`: an event's dead or waiting deliveries (or, seq None,
        every dead one) are due again now, with a fresh age."""
        with self.tx() as c:
            args: tuple[int, ...] = ()
            if seq is None:
                sql = "state = 'dead'"
            else:
                sql, args = "state IN ('dead', 'pending') AND event_seq = ?", (seq,)
            return int(c.execute(
                "UPDATE deliveries SET state = 'pending', next_at = ?, since = ?, attempts = 0, "
                "finished_at = NULL WHERE " + sql, (now, now, *args),
            ).rowcount)

    def receiver_counts(self) -> list[ReceiverCounts]:
        """Pending and dead deliveries per receiver (the index answers it; delivered
        rows are counted by the `hook_deliveries_total` counter)."""
        rows = self.conn.execute(
            "SELECT d.receiver, d.state, COUNT(*), MIN(e.created_at) FROM deliveries d "
            "JOIN events e ON e.seq = d.event_seq WHERE d.state IN ('pending', 'dead') "
            "GROUP BY d.receiver, d.state"
        ).fetchall()
        by: dict[str, dict[str, Any]] = {}
        for receiver, state, n, oldest in rows:
            r = by.setdefault(receiver, {"pending": 0, "dead": 0, "oldest": None})
            r[state] = int(n)
            if state == "pending":
                r["oldest"] = float(oldest)
        out = []
        for receiver, r in sorted(by.items()):
            head = self.next_delivery(receiver) if r["pending"] else None
            out.append(ReceiverCounts(receiver, r["pending"], r["dead"], r["oldest"],
                                      head.last_error if head else None))
        return out

    def prune_deliveries(self, before: float, limit: int | None = None) -> int:
        """Delivered and dead deliveries that finished before `before` (hooks.retention_days
        ago) are deleted, the oldest first and at most `limit` of them (None: all), and
        each event whose last delivery that was; return how many deliveries.

        The main loop prunes in batches: one write transaction holding the lock for a
        backlog of months would stall it (and `docinbox status`) for as long."""
        with self.tx() as c:
            # INDEXED BY: without statistics the planner walks deliveries_state instead,
            # every delivered row, to find the few old enough.
            rows = c.execute(
                "SELECT rowid, event_seq FROM deliveries INDEXED BY deliveries_finished "
                "WHERE state IN ('delivered', 'dead') AND finished_at < ? "
                "ORDER BY finished_at LIMIT ?",
                (before, -1 if limit is None else limit),
            ).fetchall()
            if not rows:
                return 0
            c.executemany("DELETE FROM deliveries WHERE rowid = ?", [(r[0],) for r in rows])
            seqs = sorted({int(r[1]) for r in rows})
            for at in range(0, len(seqs), 500):  # SQLite's cap on bound parameters
                chunk = seqs[at:at + 500]
                # An event goes with its last delivery. Looked up through the primary key
                # (receiver, event_seq): there is no index on event_seq alone, and a scan of
                # every delivery per event would cost a backlog's square.
                c.execute(
                    f"DELETE FROM events WHERE seq IN ({', '.join('?' * len(chunk))}) "
                    "AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.receiver IN "
                    "(SELECT DISTINCT receiver FROM deliveries) AND d.event_seq = events.seq)",
                    chunk,
                )
            return len(rows)

    # -- receivers that said 410 Gone -----------------------------------------------------

    def disable_receiver(self, name: str, identity: str, why: str, now: float) -> None:
        """The receiver answered 410 Gone: it stays disabled, across restarts, until
        `docinbox hooks retry` or a change of its configuration (`identity`)."""
        with self.tx() as c:
            c.execute(
                "INSERT INTO receivers(name, identity, disabled, since) VALUES(?, ?, ?, ?) "
                "ON CONFLICT(name) DO UPDATE SET identity = excluded.identity, "
                "disabled = excluded.disabled, since = excluded.since",
                (name, identity, why, now),
            )

    def receiver_disabled(self, name: str, identity: str) -> str | None:
        """Why the receiver is disabled, or None. A receiver configured otherwise since
        (another `identity`) is enabled again."""
        row = self.conn.execute(
            "SELECT identity, disabled FROM receivers WHERE name = ?", (name,)
        ).fetchone()
        if row is None:
            return None
        if row["identity"] != identity:
            with self.tx() as c:
                c.execute("DELETE FROM receivers WHERE name = ?", (name,))
            return None
        return str(row["disabled"])

    def enable_receivers(self) -> list[str]:
        """`docinbox hooks retry`: every disabled receiver is tried again; their names."""
        with self.tx() as c:
            names = [str(r[0]) for r in c.execute("SELECT name FROM receivers ORDER BY name")]
            c.execute("DELETE FROM receivers")
            return names
