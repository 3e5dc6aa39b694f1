"""Finished pages and their figure crops: what lets a crash at page 40 of 50 resume at
page 40, kept until the document is published (then the outbox folder is their copy).

Each page's converting time is also kept in page_times, for the status page's throughput
figures, for a while only (`prune_page_times`): rows of a size that does not depend on
the page."""

from __future__ import annotations

import json
import sqlite3

from daemon.document.page import Crop
from daemon.document.record import PageRecord, decode_blocks, encode_blocks
from daemon.jobs.db import Database

# page_times keeps at least this long (the status page's 24 hours, and a margin) ...
PAGE_TIMES_KEPT_SECONDS = 2 * 86400.0
# ... and at least this many of the newest rows (seconds per page over the last pages).
PAGE_TIMES_KEPT_ROWS = 1000


def delete_pages(c: sqlite3.Connection, job_id: int) -> None:
    """A job's pages and crops, gone (in the caller's transaction)."""
    c.execute("DELETE FROM page_crops WHERE job_id = ?", (job_id,))
    c.execute("DELETE FROM pages WHERE job_id = ?", (job_id,))


class PageRecords(Database):
    def save_page(self, job_id: int, page: PageRecord, now: float) -> None:
        """Commit one finished page with its crops, in one transaction."""
        page_idx, crops, model_output = page.page_idx, page.crops, page.model_output
        with self.tx() as c:
            c.execute(
                "INSERT OR REPLACE INTO pages(job_id, page_idx, blocks, info, engine, seconds,"
                " done_at, model_output) VALUES(?, ?, ?, ?, ?, ?, ?, ?)",
                (job_id, page_idx, encode_blocks(page.blocks), json.dumps(dict(page.info)),
                 page.engine, page.seconds, now,
                 json.dumps(dict(model_output)) if model_output is not None else None),
            )
            c.execute(
                "INSERT OR REPLACE INTO page_times(job_id, page_idx, done_at, seconds)"
                " VALUES(?, ?, ?, ?)",
                (job_id, page_idx, now, page.seconds),
            )
            c.execute("DELETE FROM page_crops WHERE job_id = ? AND page_idx = ?",
                      (job_id, page_idx))
            c.executemany(
                "INSERT INTO page_crops(job_id, page_idx, name, jpeg, width, height)"
                " VALUES(?, ?, ?, ?, ?, ?)",
                [(job_id, page_idx, cr.name, cr.jpeg, cr.size[0], cr.size[1]) for cr in crops],
            )
            c.execute(
                "UPDATE jobs SET pages_done = (SELECT COUNT(*) FROM pages WHERE job_id = ?)"
                " WHERE id = ?",
                (job_id, job_id),
            )
            self._bump(c, "pages_total")
            self._bump(c, "page_seconds_total", page.seconds)

    def pages(self, job_id: int) -> list[PageRecord]:
        """A job's finished pages in page order, with their crops."""
        rows = self.conn.execute(
            "SELECT * FROM pages WHERE job_id = ? ORDER BY page_idx", (job_id,)
        ).fetchall()
        crops = self.crops(job_id)
        return [
            PageRecord(
                page_idx=r["page_idx"],
                blocks=decode_blocks(r["blocks"]),
                engine=r["engine"],
                seconds=r["seconds"],
                info=json.loads(r["info"]),
                model_output=json.loads(r["model_output"]) if r["model_output"] else None,
                crops=tuple(crops.get(r["page_idx"], ())),
            )
            for r in rows
        ]

    def crops(self, job_id: int) -> dict[int, list[Crop]]:
        """The stored crops of a job's pages, by page index."""
        rows = self.conn.execute(
            "SELECT page_idx, name, jpeg, width, height FROM page_crops WHERE job_id = ?"
            " ORDER BY page_idx, name",
            (job_id,),
        ).fetchall()
        out: dict[int, list[Crop]] = {}
        for r in rows:
            out.setdefault(int(r["page_idx"]), []).append(
                Crop(name=r["name"], jpeg=bytes(r["jpeg"]), size=(r["width"], r["height"]))
            )
        return out

    def done_pages(self, job_id: int) -> set[int]:
        rows = self.conn.execute("SELECT page_idx FROM pages WHERE job_id = ?", (job_id,))
        return {int(r[0]) for r in rows}

    def page_seconds(self, limit: int = 200) -> list[float]:
        rows = self.conn.execute(
            "SELECT seconds FROM page_times ORDER BY done_at DESC LIMIT ?", (limit,)
        ).fetchall()
        return [float(r[0]) for r in rows]

    def pages_per_hour(self, now: float, hours: int = 24) -> list[int]:
        """Pages finished in each of the last `hours` hours, oldest first; the last
        bucket ends at `now`."""
        since = now - hours * 3600
        out = [0] * hours
        rows = self.conn.execute(
            "SELECT CAST((done_at - ?) / 3600 AS INTEGER), COUNT(*) FROM page_times "
            "WHERE done_at > ? AND done_at <= ? GROUP BY 1",
            (since, since, now),
        ).fetchall()
        for bucket, n in rows:
            out[min(max(int(bucket), 0), hours - 1)] += int(n)
        return out

    def prune_page_times(self, now: float, limit: int | None = None) -> int:
        """Forget page times older than PAGE_TIMES_KEPT_SECONDS beyond the newest
        PAGE_TIMES_KEPT_ROWS, the oldest first and at most `limit` of them (None: all);
        return how many."""
        with self.tx() as c:
            return int(c.execute(
                "DELETE FROM page_times WHERE rowid IN (SELECT rowid FROM page_times "
                "WHERE done_at < ? AND done_at < (SELECT COALESCE(MIN(done_at), 0) FROM "
                "(SELECT done_at FROM page_times ORDER BY done_at DESC LIMIT ?)) "
                "ORDER BY done_at LIMIT ?)",
                (now - PAGE_TIMES_KEPT_SECONDS, PAGE_TIMES_KEPT_ROWS,
                 -1 if limit is None else limit),
            ).rowcount)
