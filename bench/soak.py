"""Soak test: hundreds of documents dropped over time while the daemon is SIGKILLed.

    . .venv/bin/activate
    python bench/soak.py --files 220 --kills 12 --seed 1 [--root /tmp/soak] [--keep]

What it does, on a temp root with the real `python -m daemon run` and the `lite` engine:

1. Generates `--files` inputs with KNOWN text: 1-3 page text PDFs (a unique marker per
   page), some PNG images of text, a few byte-identical duplicates under other names and a
   few corrupt/truncated/empty PDFs.
2. Drops them into the inbox over `--drop-seconds` (temp name + rename, or a direct write),
   while a killer SIGKILLs the daemon at random moments (half of them while a page is in
   progress) at least `--kills` times and restarts it; also SIGKILLs the worker a few times
   (`--worker-kills`).
3. Lets the last daemon settle, stops it with SIGTERM, and checks:
   - every input has exactly one job: done with one complete output (Markdown holding each
     page's marker exactly once, meta.json, original archived), or failed with a reason
     and an error file in failed/, or a duplicate of a done one (moved to duplicates/);
   - nothing is left queued or running, the inbox is empty, no `outbox/.docinbox-tmp`;
   - no page was processed twice: the `pages_total` counter equals the rows in `pages`
     and the sum of `page_count` of done jobs (a page interrupted by a kill is not stored,
     so it is the only one ever redone), and `documents_done_total` equals the done jobs.
Prints a summary (JSON on the last line) and exits 1 on any violation.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.docgen import make_text_image, make_text_pdf  # noqa: E402

TERMINAL = ("done", "failed", "duplicate")


@dataclass
class Input:
    name: str
    kind: str  # pdf | image | duplicate | corrupt
    markers: list[str] = field(default_factory=list)  # one per page, known text
    same_as: str | None = None  # for duplicates: the name with the same bytes
    inbox: str = "inbox"  # the inbox (relative to the root) it is dropped into


def generate(src: Path, n: int, rng: random.Random) -> list[Input]:
    """`n` inputs: ~85% text PDFs, ~6% images, ~4% duplicates, ~4% corrupt."""
    n_img = max(3, n * 6 // 100)
    n_dup = max(3, n * 4 // 100)
    n_bad = max(3, n * 4 // 100)
    n_pdf = n - n_img - n_dup - n_bad
    inputs: list[Input] = []
    for i in range(n_pdf):
        pages = rng.randint(1, 3)
        markers = [f"SOAKDOC{i:04d}P{p}" for p in range(pages)]
        make_text_pdf(
            src / f"doc-{i:04d}.pdf",
            [[f"Soak document {i}", f"Marker {m} on page {p + 1}"] for p, m in enumerate(markers)],
        )
        inputs.append(Input(f"doc-{i:04d}.pdf", "pdf", markers))
    words = ["ALPHA", "BRAVO", "CHARLIE", "DELTA", "ECHO", "FOXTROT", "GOLF", "HOTEL"]
    for i in range(n_img):
        text = f"{words[i % len(words)]} {1000 + i}"
        make_text_image(src / f"img-{i:03d}.png", [text], size=(900, 300), font_px=56)
        inputs.append(Input(f"img-{i:03d}.png", "image", [text]))
    pdfs = [x for x in inputs if x.kind == "pdf"]
    for i, orig in enumerate(rng.sample(pdfs, n_dup)):
        name = f"copy-{i:03d} of {orig.name}"
        shutil.copyfile(src / orig.name, src / name)
        inputs.append(Input(name, "duplicate", list(orig.markers), same_as=orig.name))
    for i in range(n_bad):
        name = f"bad-{i:03d}.pdf"
        if i % 3 == 0:
            data = b"%PDF-1.7\n" + os.urandom(3000)
        elif i % 3 == 1:
            full = (src / pdfs[i].name).read_bytes()
            # Cut before its page text, two halves could be byte-identical: the mark
            # keeps each broken file its own content (not a duplicate of another).
            data = full[: len(full) // 2] + b"\n%% cut %d\n" % i
        else:
            data = b"%%PDF-1.4\n%% empty body %d\n%%%%EOF\n" % i
        (src / name).write_bytes(data)
        inputs.append(Input(name, "corrupt"))
    rng.shuffle(inputs)
    return inputs


def write_config(root: Path, page_delay: float, extra: dict[str, Any] | None = None) -> Path:
    """The soak's config; `extra` adds or replaces top-level keys (bench/longhaul.py)."""
    engine: dict[str, Any] = {"name": "lite", "fallback_engine": None, "dpi": 100}
    if page_delay > 0:
        engine = {**engine, "name": "tests.plugins:FaultEngine",
                  "options": {"fault": "slow", "slow_seconds": page_delay}}
    cfg = {
        "inboxes": [{"path": "inbox"}],
        "outbox": "outbox",
        "archive": "archive",
        "failed": "failed",
        "duplicates": "duplicates",
        "state_dir": "state",
        "stability_seconds": 1,
        "rescan_seconds": 3,
        "engine": engine,
        "worker": {"heartbeat_seconds": 1, "restart_backoff_seconds": 0.5},
        "logging": {"level": "INFO"},
        **(extra or {}),
    }
    (root / "inbox").mkdir(parents=True, exist_ok=True)
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


class Daemon:
    """The real daemon process; every start appends to one log file."""

    def __init__(self, root: Path, config: Path) -> None:
        self.root, self.config = root, config
        self.log = root / "daemon.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.lock = threading.Lock()

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
        with open(self.log, "ab") as logf:
            logf.write(f"\n===== soak: start #{self.starts + 1} at {time.time():.3f}\n".encode())
            logf.flush()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "daemon", "run", "--config", str(self.config)],
                cwd=self.root, env=env, stdout=logf, stderr=subprocess.STDOUT,
            )
        self.starts += 1

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(30)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(120)


def db_rows(root: Path, sql: str) -> list[sqlite3.Row]:
    db = root / "state" / "docinbox.sqlite3"
    if not db.exists():
        return []
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(sql).fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()


def runtime(root: Path) -> dict[str, Any]:
    return {r["key"]: json.loads(r["value"]) for r in db_rows(root, "SELECT * FROM runtime")}


class Killer:
    """SIGKILLs the daemon (half the time while a page is in progress) and now and then
    the worker, every `min_gap`..`max_gap` s, restarting the daemon 0-1.5 s later.
    `paused` holds it off (bench/longhaul.py pauses it while a share hangs)."""

    def __init__(self, d: Daemon, root: Path, args: argparse.Namespace, started: float) -> None:
        self.d, self.root, self.args, self.started = d, root, args, started
        self.kills: list[dict[str, Any]] = []
        self.worker_kills: list[dict[str, Any]] = []
        self.stopping = threading.Event()
        self.paused = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()

    def wait_for_page(self) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not self.stopping.is_set():
            cur = runtime(self.root).get("current") or {}
            if cur.get("page"):
                break
            time.sleep(0.1)

    def loop(self) -> None:
        krng = random.Random(self.args.seed + 1)
        wk_left = self.args.worker_kills
        d = self.d
        while not self.stopping.is_set():
            if self.stopping.wait(krng.uniform(self.args.min_gap, self.args.max_gap)):
                return
            targeted = krng.random() < 0.5
            if targeted:  # wait (bounded) until a page is in progress
                self.wait_for_page()
                time.sleep(krng.uniform(0, 0.5))
            if self.paused.is_set():
                continue
            with d.lock:
                if not d.alive():
                    continue
                rt = runtime(self.root)
                if wk_left > 0 and krng.random() < 0.25 and rt.get("worker_pid"):
                    try:
                        os.kill(int(rt["worker_pid"]), signal.SIGKILL)
                        wk_left -= 1
                        self.worker_kills.append({"t": round(time.monotonic() - self.started, 1),
                                                  "current": rt.get("current")})
                        continue
                    except ProcessLookupError:
                        pass
                d.kill9()
                self.kills.append({"t": round(time.monotonic() - self.started, 1),
                                   "targeted": targeted, "current": rt.get("current")})
                time.sleep(krng.uniform(0, 1.5))
                d.start()
            print(f"soak: t={time.monotonic() - self.started:6.1f}s kills={len(self.kills)} "
                  f"worker_kills={len(self.worker_kills)}", flush=True)


def drop_one(src: Path, inbox: Path, name: str, rng: random.Random) -> None:
    if rng.random() < 0.7:  # the careful writer: temp name, then rename
        tmp = inbox / f".{name}.part"
        shutil.copyfile(src / name, tmp)
        os.rename(tmp, inbox / name)
    else:  # written in place under its final name
        shutil.copyfile(src / name, inbox / name)


def run(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="docinbox-soak-"))
    if root.exists() and any(root.iterdir()):
        print(f"soak: {root} is not empty", file=sys.stderr)
        return 2
    root.mkdir(parents=True, exist_ok=True)
    src = root / "src"
    src.mkdir()
    t0 = time.monotonic()
    inputs = generate(src, args.files, rng)
    print(f"soak: generated {len(inputs)} inputs in {time.monotonic() - t0:.1f} s under {root}",
          flush=True)
    config = write_config(root, args.page_delay)
    inbox = root / "inbox"
    d = Daemon(root, config)
    d.start()
    started = time.monotonic()

    killer = Killer(d, root, args, started)
    killer.start()

    # Drops spread over drop_seconds, in small bursts.
    order = list(inputs)
    gaps = sorted(rng.uniform(0, args.drop_seconds) for _ in order)
    for item, at in zip(order, gaps, strict=True):
        delay = at - (time.monotonic() - started)
        if delay > 0:
            time.sleep(delay)
        drop_one(src, inbox, item.name, rng)
    print(f"soak: all {len(order)} dropped at t={time.monotonic() - started:.0f}s", flush=True)

    # Keep killing until enough kills happened, then let it settle.
    while len(killer.kills) < args.kills:
        time.sleep(1)
    killer.stop()
    n = len(inputs)
    settle(d, root, n, args.settle_timeout)
    code = d.stop()
    duration = time.monotonic() - started
    problems = verify(root, inputs, code)

    summary = summarize(root, inputs, d, killer, code, duration, problems)
    print("soak: kills at t=" + ", ".join(str(k["t"]) for k in killer.kills))
    for p in problems:
        print(f"VIOLATION: {p}")
    print("soak: OK" if not problems else f"soak: FAILED ({len(problems)} violations)")
    print(json.dumps(summary))
    if not problems and not args.keep and not args.root:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if not problems else 1


def settle(d: Daemon, root: Path, n: int, timeout: float,
           inboxes: list[Path] | None = None) -> None:
    """Restart the daemon if it is down; wait until `n` jobs are all terminal and nothing
    is left in `inboxes` (a file re-taken as a second job must not end the wait early)."""
    with d.lock:
        if not d.alive():
            d.start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = db_rows(root, "SELECT state FROM jobs")
        left = any(p.is_file() for i in inboxes or [] for p in i.rglob("*"))
        if len(jobs) >= n and all(j["state"] in TERMINAL for j in jobs) and not left:
            break
        if not d.alive():
            print("soak: the daemon exited by itself; restarting it", flush=True)
            d.start()
        time.sleep(1)
    # One more rescan period: anything left in the inbox would be taken now.
    time.sleep(5)


def summarize(root: Path, inputs: list[Input], d: Daemon, killer: Killer, code: int,
              duration: float, problems: list[str]) -> dict[str, Any]:
    kills, worker_kills = killer.kills, killer.worker_kills
    n = len(inputs)
    jobs = db_rows(root, "SELECT state, count(*) AS n FROM jobs GROUP BY state")
    counters = {r["name"]: r["value"] for r in db_rows(root, "SELECT * FROM counters")}
    return {
        "root": str(root),
        "inputs": n,
        "by_kind": {k: sum(1 for x in inputs if x.kind == k)
                    for k in ("pdf", "image", "duplicate", "corrupt")},
        "expected_pages": sum(len(x.markers) for x in inputs if x.kind in ("pdf", "image")),
        "daemon_kills": len(kills),
        "targeted_kills_mid_page": sum(1 for k in kills if (k["current"] or {}).get("page")),
        "worker_kills": len(worker_kills),
        "daemon_starts": d.starts,
        "jobs": {r["state"]: r["n"] for r in jobs},
        "counters": counters,
        "final_exit_code": code,
        "duration_seconds": round(duration, 1),
        "violations": problems,
    }


def verify(root: Path, inputs: list[Input], exit_code: int) -> list[str]:
    problems: list[str] = []
    if exit_code != 0:
        problems.append(f"final SIGTERM stop exited {exit_code}")
    jobs = [dict(r) for r in db_rows(root, "SELECT * FROM jobs ORDER BY id")]
    by_source: dict[str, list[dict[str, Any]]] = {}
    for j in jobs:
        by_source.setdefault(j["source_path"], []).append(j)
    for j in jobs:
        if j["state"] not in TERMINAL:
            problems.append(f"job {j['id']} {j['source_path']} left {j['state']}")
    expected_paths = {str(root / x.inbox / x.name) for x in inputs}
    for path in by_source:
        if path not in expected_paths:
            problems.append(f"job for an unknown path {path}")
    done_by_name: dict[str, dict[str, Any]] = {}
    for x in inputs:
        js = by_source.get(str(root / x.inbox / x.name), [])
        if len(js) != 1:
            problems.append(f"{x.name}: {len(js)} jobs (expected exactly 1)")
            continue
        j = js[0]
        if j["state"] == "done":
            done_by_name[x.name] = j
    # Which copy of a duplicated content was processed depends on arrival order.
    groups: dict[str, list[Input]] = {}
    for x in inputs:
        if x.kind in ("pdf", "image", "duplicate"):
            groups.setdefault(x.same_as or x.name, []).append(x)
    for key, members in groups.items():
        states = sorted(by_source[str(root / m.inbox / m.name)][0]["state"] for m in members
                        if len(by_source.get(str(root / m.inbox / m.name), [])) == 1)
        want = ["done"] + ["duplicate"] * (len(members) - 1)
        if states != want:
            problems.append(f"content of {key}: states {states}, expected {want}")
        for m in members:
            done = done_by_name.get(m.name)
            if done is None:
                continue
            problems += check_output(root, m, done)
        for m in members:
            js = by_source.get(str(root / m.inbox / m.name), [])
            if js and js[0]["state"] == "duplicate" and not (root / "duplicates" / m.name).exists():
                problems.append(f"{m.name}: duplicate not moved to duplicates/")
    for x in inputs:
        if x.kind != "corrupt":
            continue
        js = by_source.get(str(root / x.inbox / x.name), [])
        if len(js) != 1:
            continue
        j = js[0]
        if j["state"] != "failed" or not j["error_kind"] or not j["error"]:
            problems.append(f"{x.name}: expected failed with a reason, got {j['state']} "
                            f"{j['error_kind']} {j['error']}")
        if not (root / "failed" / x.name).exists():
            problems.append(f"{x.name}: not in failed/")
        elif not (root / "failed" / f"{x.name}.error.json").exists():
            problems.append(f"{x.name}: no error file in failed/")
    left = [p for i in sorted({x.inbox for x in inputs}) for p in (root / i).rglob("*")
            if p.is_file()]
    if left:
        problems.append(f"files left in the inbox: {[p.name for p in left][:10]}")
    tmp = root / "outbox" / ".docinbox-tmp"
    if tmp.exists() and any(tmp.iterdir()):
        problems.append(f"orphan temp folders: {[p.name for p in tmp.iterdir()]}")
    # Pages: each page of each done document stored once, and never computed twice (a
    # published document's pages leave the database; their times stay a while).
    counters = {r["name"]: r["value"] for r in db_rows(root, "SELECT * FROM counters")}
    rows = db_rows(root, "SELECT count(*) AS n FROM page_times")[0]["n"]
    done_pages = sum(int(j["page_count"] or 0) for j in jobs if j["state"] == "done")
    expected = sum(len(x.markers) for x in inputs if x.kind in ("pdf", "image"))
    if int(counters.get("pages_total", 0)) != rows:
        problems.append(f"pages_total counter {counters.get('pages_total')} != {rows} page rows:"
                        " some page was processed more than once")
    if done_pages != expected or rows < expected:
        problems.append(f"pages: {done_pages} in done jobs, {rows} stored, {expected} expected")
    n_done = sum(1 for j in jobs if j["state"] == "done")
    if int(counters.get("documents_done_total", 0)) != n_done:
        problems.append(f"documents_done_total {counters.get('documents_done_total')} != {n_done}")
    outputs = list((root / "outbox").rglob("*.md"))
    if len(outputs) != n_done:
        problems.append(f"{len(outputs)} Markdown outputs for {n_done} done jobs")
    return problems


def check_output(root: Path, x: Input, j: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    out = Path(j["output_dir"] or "")
    md = out / f"{out.name}.md" if out.name else None
    if md is None or not md.exists():
        mds = list(out.glob("*.md")) if out.is_dir() else []
        md = mds[0] if len(mds) == 1 else None
    if md is None:
        return [f"{x.name}: done but no Markdown in {out}"]
    text = md.read_text()
    if not (md.with_name(md.stem + ".meta.json")).exists():
        problems.append(f"{x.name}: no meta.json")
    if x.kind in ("pdf", "duplicate"):
        for m in x.markers:
            if text.count(m) != 1:
                problems.append(f"{x.name}: marker {m} appears {text.count(m)} times")
        if int(j["page_count"] or 0) != len(x.markers):
            problems.append(f"{x.name}: page_count {j['page_count']} != {len(x.markers)}")
    elif not text.strip():
        problems.append(f"{x.name}: empty Markdown for an image")
    if not (root / "archive" / x.name).exists():
        problems.append(f"{x.name}: original not archived")
    return problems


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--files", type=int, default=220)
    p.add_argument("--kills", type=int, default=12, help="minimum daemon SIGKILLs")
    p.add_argument("--worker-kills", type=int, default=3, help="worker SIGKILLs (at most)")
    p.add_argument("--drop-seconds", type=float, default=480)
    p.add_argument("--min-gap", type=float, default=8, help="seconds between kills, min")
    p.add_argument("--max-gap", type=float, default=45, help="seconds between kills, max")
    p.add_argument("--page-delay", type=float, default=0,
                   help="extra seconds per page (tests.plugins:FaultEngine wrapping lite)")
    p.add_argument("--settle-timeout", type=float, default=1800)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--root", help="empty folder to run in (kept); default a temp folder")
    p.add_argument("--keep", action="store_true", help="keep the temp folder on success")
    return run(p.parse_args())


if __name__ == "__main__":
    sys.exit(main())
