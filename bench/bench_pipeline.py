"""The worker's page pipeline: how long the engine waits between the pages of a document.

Runs one multi-page PDF through the real supervisor and a real worker process (the daemon's
own code path and main-loop wait, a throw-away state folder, the real clock) three ways:
as before this change (no lookahead, the main loop sleeps its whole 0.25 s tick), with the
main loop woken by the worker's answer, and with that plus the page pipeline
(`ParsePage.lookahead` names the next pages: the worker renders the next page and reads its
text layer while the engine works). Each page's info records `engine_seconds` (its time in
`parse_page`) and `idle_seconds` (how long the engine waited for it after the page before);
the table sums them over the pages after the first.

    .venv/bin/python bench/bench_pipeline.py                       # lite, redp5110 (18 pages)
    .venv/bin/python bench/bench_pipeline.py --engine lite --dpi 200 --runs 2 FILE.pdf

"model busy" = engine / (engine + idle) over the document's pages 2..N. The load average
before and after each run is printed: on a shared machine, read the figures with it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from daemon.config.settings import check_paths, load_config
from daemon.document.page import Json
from daemon.document.record import PageRecord
from daemon.intake.ingest import Ingestor
from daemon.jobs.states import JobState
from daemon.jobs.store import Job, NewEvent, Store
from daemon.output.publish import Publisher
from daemon.service.app import TICK_SECONDS
from daemon.supervisor.supervisor import Supervisor

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PDF = REPO.parent / "shared" / "corpus" / "pdf" / "docling__redp5110_sampled.pdf"
# (name, pages named ahead, main loop wakes on the worker's answer)
VARIANTS = (
    ("before: no lookahead, tick sleep", 0, False),
    ("wake on answer, no lookahead", 0, True),
    ("wake on answer + pipeline", Supervisor.LOOKAHEAD, True),
)


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _seconds(value: Json) -> float:
    """A page's timing fact (None when the worker measured none)."""
    return float(value) if isinstance(value, int | float) else 0.0


class _KeepPages(Store):
    """The store, keeping a document's pages as they were when it was done: a published
    document's pages leave the database, and the figures below are read from them."""

    kept: tuple[PageRecord, ...] = ()

    def finish_job(
        self, job_id: int, now: float, output_dir: str, seconds: float,
        *, event: NewEvent | None = None,
    ) -> Job:
        self.kept = tuple(self.pages(job_id))
        return super().finish_job(job_id, now, output_dir, seconds, event=event)


def run_once(pdf: Path, engine: str, dpi: int, lookahead: int, wake: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="docinbox-bench-pipeline-") as tmp:
        root = Path(tmp)
        (root / "inbox").mkdir()
        raw = {
            "inboxes": [{"path": "inbox"}],
            "outbox": "outbox", "archive": "archive", "failed": "failed",
            "duplicates": "duplicates", "state_dir": "state",
            "after_success": "keep",
            "engine": {"name": engine, "fallback_engine": None, "dpi": dpi},
        }
        (root / "config.yaml").write_text(yaml.safe_dump(raw))
        cfg = load_config(root / "config.yaml")
        assert check_paths(cfg) == []
        src = root / "inbox" / pdf.name
        src.write_bytes(pdf.read_bytes())
        store = _KeepPages(cfg.db_path)
        result = Ingestor(cfg, store, time.time).ingest(cfg.inboxes[0], src)
        assert result is not None
        sup = Supervisor(cfg, store, Publisher(cfg, store, time.time), wall=time.time)
        sup.LOOKAHEAD = lookahead
        job_id = result.job.id
        started: float | None = None
        try:
            while True:
                job = store.job(job_id)
                assert job is not None
                if job.state in (JobState.DONE, JobState.FAILED):
                    break
                sup.tick(time.monotonic())
                if started is None and sup.current is not None and sup.current.page_idx == 0:
                    started = time.monotonic()
                # The daemon's main loop between ticks: now it wakes when the worker answers;
                # before, it slept the whole tick.
                if wake:
                    sup.wait(TICK_SECONDS)
                else:
                    time.sleep(TICK_SECONDS)
            wall = time.monotonic() - (started or time.monotonic())
            assert job.state == JobState.DONE, job.error
            pages = list(store.kept)
        finally:
            sup.request_stop(time.monotonic())
            while not sup.stopped:
                sup.tick(time.monotonic())
                time.sleep(0.05)
            store.close()
    later = pages[1:]  # the first page has no page before it
    engine_s = sum(_seconds(p.info.get("engine_seconds")) for p in later)
    idle_s = sum(_seconds(p.info.get("idle_seconds")) for p in later)
    return {
        "pages": len(pages),
        "wall": wall,
        "engine": engine_s,
        "idle": idle_s,
        "idle_per_page": idle_s / max(1, len(later)),
        "busy": engine_s / max(1e-9, engine_s + idle_s),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pdf", nargs="?", type=Path, default=DEFAULT_PDF)
    ap.add_argument("--engine", default="lite")
    ap.add_argument("--dpi", type=int, default=200)
    ap.add_argument("--runs", type=int, default=1, help="runs of each variant, alternating")
    args = ap.parse_args()
    if not args.pdf.is_file():
        print(f"no such file: {args.pdf} (the shared corpus is ../shared/corpus)")
        return 2
    print(f"# {args.pdf.name}, engine {args.engine}, {args.dpi} DPI; "
          f"pages 2..N summed; load average 1/5/15 min before -> after\n")
    print("| variant | pages | wall s | engine s | idle s | idle s/page | model busy | load |")
    print("|---|---|---|---|---|---|---|---|")
    for _ in range(args.runs):
        for name, lookahead, wake in VARIANTS:
            before = load()
            r = run_once(args.pdf, args.engine, args.dpi, lookahead, wake)
            print(f"| {name} | {r['pages']:.0f} | {r['wall']:.1f} | {r['engine']:.1f} | "
                  f"{r['idle']:.2f} | {r['idle_per_page']:.3f} | {100 * r['busy']:.1f} % | "
                  f"{before} -> {load()} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
