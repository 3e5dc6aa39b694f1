"""What hooks cost the main loop: finishing documents with hooks off, and with a webhook
receiver that is down.

    . .venv/bin/activate
    python bench/bench_hooks.py [--docs 1000] [--out results.json]

The daemon's own per-document work, minus the model: for each document the main loop's
calls in the order the daemon makes them, on a real store (WAL, `synchronous=FULL`) and a
real outbox on a temp folder: `record_arrival` (ingest), `start_job`, `save_page` (one
finished page), `Publisher.complete` (the outbox folder written and fsynced, the
original archived) and `finish_job` (the outcome; with hooks, its event and delivery row
in the same transaction). The model is left out on purpose: it takes seconds to minutes
per page and would hide the difference under its own noise.

Three runs on fresh folders:

1. `off`: no hooks configured.
2. `down`: one webhook to a port nobody listens on, the default back-off (5 s first
   wait): its delivery thread runs beside the loop, failing, as it would all night.
3. `down-hammer`: the same with a 0.05 s back-off, so the delivery thread fails and
   writes its failed attempt to the database about 20 times a second: the worst case for
   contention on the database and the GIL.

Printed per run: documents per second, the slowest document, and (hooks on) what waits
at the end (pending deliveries, oldest age), as `/metrics` would show it. Also the load
average before and after: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from daemon.config.settings import check_paths, load_config  # noqa: E402
from daemon.document.page import Block, EngineInfo  # noqa: E402
from daemon.document.record import PageRecord  # noqa: E402
from daemon.jobs.store import Store  # noqa: E402
from daemon.output.publish import Publisher  # noqa: E402
from daemon.service.hooks import HookService  # noqa: E402
from tests.hookreceiver import free_port  # noqa: E402

BLOCKS = (
    Block(type="title", bbox=(0.1, 0.08, 0.9, 0.12), text="Benchmark document"),
    Block(type="text", bbox=(0.1, 0.15, 0.9, 0.4),
          text="The quick brown fox jumps over the lazy dog. " * 8),
)


def run(root: Path, docs: int, hooks: dict[str, Any] | None) -> dict[str, Any]:
    (root / "inbox").mkdir(parents=True)
    cfg_data: dict[str, Any] = {"inboxes": ["inbox"], "outbox": "outbox",
                                "engine": {"name": "lite", "fallback_engine": None}}
    if hooks is not None:
        cfg_data["hooks"] = hooks
    (root / "config.yaml").write_text(yaml.safe_dump(cfg_data))
    cfg = load_config(root / "config.yaml")
    assert not check_paths(cfg, create=True)
    store = Store(cfg.db_path)
    service = HookService(cfg)
    service.start(store)
    publisher = Publisher(cfg, store, time.time, service)
    inbox = cfg.inboxes[0].path
    times: list[float] = []
    start = time.perf_counter()
    for i in range(docs):
        t0 = time.perf_counter()
        src = inbox / f"doc-{i:04d}.pdf"
        data = f"%PDF-1.4 benchmark document {i}\n".encode()
        src.write_bytes(data)
        st = src.stat()
        result = store.record_arrival(
            path=str(src), inbox=str(inbox), subdir="", size=st.st_size,
            mtime_ns=st.st_mtime_ns, sha256=f"{i:064x}", now=time.time())
        assert result is not None
        job = store.start_job(result.job.id, time.time(), "lite")
        store.set_page_count(job.id, 1)
        page = PageRecord(page_idx=0, blocks=BLOCKS, engine="lite", seconds=0.5,
                          info={"page_size_pt": [612, 792]})
        store.save_page(job.id, page, time.time())
        job = store.job(job.id) or job
        seconds = time.perf_counter() - t0
        done = publisher.complete(job, EngineInfo(name="lite"), seconds)
        store.finish_job(job.id, time.time(), done.folder, seconds, event=done.event)
        service.wake_if_new()
        times.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - start
    counts = store.receiver_counts()
    now = time.time()
    service.stop()
    store.close()
    pending = sum(c.pending for c in counts)
    oldest = min((c.oldest_pending_at for c in counts if c.oldest_pending_at), default=None)
    failed = int(Store(cfg.db_path).counters().get("hook_attempts_failed_total", 0))
    return {
        "docs": docs,
        "seconds": round(elapsed, 2),
        "docs_per_second": round(docs / elapsed, 1),
        "median_ms": round(statistics.median(times) * 1000, 2),
        "p99_ms": round(sorted(times)[int(len(times) * 0.99) - 1] * 1000, 2),
        "max_ms": round(max(times) * 1000, 2),
        "pending": pending,
        "oldest_pending_age_s": round(now - oldest, 1) if oldest else None,
        "failed_attempts": failed,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=1000, help="per configuration")
    ap.add_argument("--rounds", type=int, default=4,
                    help="the configurations take turns this many times (the machine's "
                    "other load drifts; each gets docs/rounds per turn)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    down = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens there
    configs: dict[str, dict[str, Any] | None] = {
        "off": None,
        "down": {"webhooks": [{"url": down, "name": "down"}]},
        "down-hammer": {"webhooks": [{"url": down, "name": "down"}],
                        "retry_backoff_seconds": 0.05, "retry_backoff_max_seconds": 0.05},
    }
    results: dict[str, Any] = {"load_before": os.getloadavg()}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    per_round = max(1, args.docs // args.rounds)
    for turn in range(args.rounds):
        for name, hooks in configs.items():
            with tempfile.TemporaryDirectory(prefix=f"bench-hooks-{name}-") as tmp:
                r = run(Path(tmp), per_round, hooks)
            runs[name].append(r)
            print(f"round {turn + 1} {name:>12}: {r['docs_per_second']:7.1f} docs/s  "
                  f"median {r['median_ms']} ms  p99 {r['p99_ms']} ms  pending {r['pending']}  "
                  f"oldest {r['oldest_pending_age_s']} s  failed attempts "
                  f"{r['failed_attempts']}", flush=True)
    for name, rs in runs.items():
        docs = sum(r["docs"] for r in rs)
        seconds = sum(r["seconds"] for r in rs)
        results[name] = {
            "docs": docs,
            "seconds": round(seconds, 2),
            "docs_per_second": round(docs / seconds, 1),
            "median_of_round_medians_ms": statistics.median(r["median_ms"] for r in rs),
            "worst_p99_ms": max(r["p99_ms"] for r in rs),
            "pending_at_end_of_each_round": [r["pending"] for r in rs],
            "failed_attempts": sum(r["failed_attempts"] for r in rs),
            "rounds": rs,
        }
        print(f"{name:>12}: {docs} docs in {seconds:.1f} s = {docs / seconds:.1f} docs/s")
    results["load_after"] = os.getloadavg()
    off = results["off"]["docs_per_second"]
    for name in ("down", "down-hammer"):
        ratio = results[name]["docs_per_second"] / off
        results[f"ratio_{name}"] = round(ratio, 3)
        print(f"{name} / off: {ratio:.3f}")
    print(f"load average before {results['load_before']}, after {results['load_after']}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
