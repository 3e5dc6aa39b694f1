"""Long-haul soak: thousands of documents, every fault of issue 31 in one run, sampled.

    . .venv/bin/activate   # as root: it mounts a tmpfs and a bindfs
    python bench/longhaul.py --files 5000 --drop-seconds 3000 --kills 20 --seed 31 \\
        --root /tmp/longhaul --out docs/longhaul

Built on bench/soak.py (same inputs, daemon, killer and checks), with, in ONE run:

- the state folder on a small tmpfs (`--state-mb`), filled to the last byte once for
  `--full-seconds` (a ballast file), then freed: the full state disk;
- a second inbox `share/` on bindfs (`watch: poll`) over `nas/`; a share of the inputs is
  dropped into `nas/`; once the bindfs process is SIGSTOPped for `--hang-seconds` (every
  call into the mount hangs, like a dead hard NFS mount), then SIGCONTed; meanwhile the
  killer is held off and `/healthz` is asked every second (answer time, share named);
- the local inbox moved away for `--vanish-seconds` and back (the vanished share);
- a webhook receiver (a real HTTP server in this process) that goes down for
  `--receiver-down-seconds` and comes back on the same port;
- `hooks.retention_days` of `--retention-days` (fractions allowed), so delivered events are
  pruned within the run;
- daemon and worker SIGKILLs during the first `--fault-fraction` of the drop period; the rest
  is one uninterrupted daemon life, where the slopes are taken.

Every `--sample-seconds` (10) it samples RSS, fds and threads of daemon and worker, the
database, WAL and log bytes, and the queue. At the end, besides bench/soak.py's checks
(0 lost, 0 twice, 0 partial): every job's `document.*` event reached the receiver at least
once, a redelivered id carried the same event, nothing is left pending in `deliveries`.
Writes OUT.json (samples + summary) and OUT.png; exits 1 on any violation.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.soak import (
    Daemon,
    Input,
    Killer,
    db_rows,
    drop_one,
    generate,
    runtime,
    settle,
    summarize,
    verify,
    write_config,
)
from tests.hookreceiver import Received, Receiver, free_port

# ----------------------------------------------------------------------------- sampling


@dataclass
class Sample:
    t: float
    done: int  # terminal jobs
    queue: int  # queued + running
    daemon_pid: int | None
    daemon_rss: int | None
    daemon_fds: int | None
    daemon_threads: int | None
    worker_pid: int | None
    worker_rss: int | None
    worker_fds: int | None
    worker_threads: int | None
    db_bytes: int
    wal_bytes: int
    log_bytes: int
    state_free_bytes: int


def proc_figures(pid: int | None) -> tuple[int | None, int | None, int | None]:
    if pid is None:
        return None, None, None
    try:
        p = psutil.Process(pid)
        return p.memory_info().rss, p.num_fds(), p.num_threads()
    except psutil.Error:
        return None, None, None


def size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def take_sample(root: Path, d: Daemon, started: float) -> Sample:
    counts = {r["state"]: r["n"] for r in
              db_rows(root, "SELECT state, count(*) AS n FROM jobs GROUP BY state")}
    dpid = d.proc.pid if d.alive() and d.proc is not None else None
    # The worker as the daemon names it: the daemon has other children (not the worker).
    wpid = runtime(root).get("worker_pid") if dpid is not None else None
    db = root / "state" / "docinbox.sqlite3"
    free = shutil.disk_usage(root / "state").free
    return Sample(
        round(time.monotonic() - started, 1),
        sum(counts.get(s, 0) for s in ("done", "failed", "duplicate")),
        counts.get("queued", 0) + counts.get("running", 0),
        dpid, *proc_figures(dpid), wpid, *proc_figures(wpid),
        size(db), size(db.with_name(db.name + "-wal")), size(d.log), free,
    )


class Sampler:
    def __init__(self, root: Path, d: Daemon, started: float, every: float) -> None:
        self.root, self.d, self.started, self.every = root, d, started, every
        self.samples: list[Sample] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self) -> None:
        while not self.stopping.wait(self.every):
            s = take_sample(self.root, self.d, self.started)
            self.samples.append(s)
            print(f"longhaul: t={s.t:7.1f}s done={s.done} queue={s.queue} "
                  f"daemon_rss={(s.daemon_rss or 0) >> 20}MiB db={s.db_bytes >> 10}KiB "
                  f"wal={s.wal_bytes >> 10}KiB", flush=True)


# ----------------------------------------------------------------------------- faults


@dataclass
class Fault:
    name: str
    start: float
    end: float
    notes: dict[str, Any] = field(default_factory=dict)


def fill_disk(folder: Path) -> Path:
    """Write a ballast file until the file system is full; returns it. Unbuffered, so
    that no write is left pending to fail at close."""
    ballast = folder / "ballast"
    with open(ballast, "wb", buffering=0) as f:
        for chunk in (1 << 20, 4096, 512):
            data = b"\0" * chunk
            with contextlib.suppress(OSError):
                while True:
                    f.write(data)
    return ballast


def healthz(port: int) -> tuple[float, dict[str, Any] | None]:
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
            body = json.loads(r.read())
    except OSError as e:
        body = {"error": str(e)}
        if hasattr(e, "read"):
            with contextlib.suppress(OSError, ValueError):
                body = json.loads(e.read())
    return time.monotonic() - t0, body


class Restarter:
    """What systemd's `Restart=on-failure` does: a daemon that exited by itself (not
    SIGKILLed by the killer, which restarts it at once) is started again after `delay` s."""

    def __init__(self, d: Daemon, delay: float) -> None:
        self.d, self.delay = d, delay
        self.exits: list[dict[str, Any]] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self) -> None:
        while not self.stopping.wait(1):
            with self.d.lock:
                if self.d.alive() or self.d.proc is None:
                    continue
                code = self.d.proc.returncode
            if self.stopping.wait(self.delay):
                return
            with self.d.lock:
                if not self.d.alive():
                    self.exits.append({"t": time.time(), "exit_code": code})
                    print(f"longhaul: the daemon exited by itself ({code}); restarted",
                          flush=True)
                    self.d.start()


class Faults:
    """The one-off faults, each at its moment of the fault phase, one after the other."""

    def __init__(self, ctx: Run) -> None:
        self.ctx = ctx
        self.done: list[Fault] = []

    def at(self, seconds: float) -> None:
        wait = seconds - (time.monotonic() - self.ctx.started)
        if wait > 0:
            time.sleep(wait)

    def now(self) -> float:
        return round(time.monotonic() - self.ctx.started, 1)

    def run(self) -> None:
        a = self.ctx.args
        span = a.drop_seconds * a.fault_fraction
        self.at(span * 0.10)
        self.receiver_down(a.receiver_down_seconds)
        self.at(span * 0.30)
        self.full_disk(a.full_seconds)
        self.at(span * 0.50)
        self.hang_share(a.hang_seconds)
        self.at(span * 0.75)
        self.vanish_inbox(a.vanish_seconds)

    def receiver_down(self, seconds: float) -> None:
        t = self.now()
        self.ctx.receiver.stop()
        time.sleep(seconds)
        self.ctx.receiver.start()
        self.done.append(Fault("receiver down", t, self.now()))

    def full_disk(self, seconds: float) -> None:
        t = self.now()
        ballast = fill_disk(self.ctx.root / "state")
        free = shutil.disk_usage(self.ctx.root / "state").free
        time.sleep(seconds)
        ballast.unlink()
        self.done.append(Fault("state disk full", t, self.now(), {"free_bytes": free}))

    def hang_share(self, seconds: float) -> None:
        ctx = self.ctx
        ctx.killer.paused.set()
        with ctx.d.lock:  # a kill in progress finishes first
            pass
        t = self.now()
        os.kill(ctx.bindfs.pid, signal.SIGSTOP)
        probes: list[dict[str, Any]] = []
        restarts_before = ctx.d.starts
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            took, body = healthz(ctx.http_port)
            probes.append({"t": self.now(), "took": round(took, 2), "body": body})
            time.sleep(1)
        os.kill(ctx.bindfs.pid, signal.SIGCONT)
        named = [p["t"] - t for p in probes if (p["body"] or {}).get("shares_not_answering")]
        self.done.append(Fault("share hung (bindfs SIGSTOP)", t, self.now(), {
            "probes": len(probes),
            "healthz_max_seconds": max((p["took"] for p in probes), default=None),
            "share_named_after_seconds": named[0] if named else None,
            "daemon_restarts_during_hang": ctx.d.starts - restarts_before,
            "first_named_body": next((p["body"] for p in probes
                                      if (p["body"] or {}).get("shares_not_answering")), None),
        }))
        ctx.killer.paused.clear()

    def vanish_inbox(self, seconds: float) -> None:
        ctx = self.ctx
        with ctx.drop_lock:
            t = self.now()
            inbox = ctx.root / "inbox"
            away = ctx.root / "inbox.away"
            os.rename(inbox, away)
            time.sleep(seconds)
            os.rename(away, inbox)
        self.done.append(Fault("inbox moved away and back", t, self.now()))


# ----------------------------------------------------------------------------- the run


@dataclass
class Run:
    args: argparse.Namespace
    root: Path
    d: Daemon
    receiver: Receiver
    bindfs: subprocess.Popen[bytes]
    http_port: int
    started: float
    killer: Killer
    drop_lock: threading.Lock


def mounted(path: Path) -> bool:
    return any(line.split()[4] == str(path) for line in
               Path("/proc/self/mountinfo").read_text().splitlines())


def wait_mounted(path: Path, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + 30
    while not mounted(path):
        if time.monotonic() > deadline or (proc is not None and proc.poll() is not None):
            raise SystemExit(f"longhaul: {path} did not mount")
        time.sleep(0.1)


def set_up(root: Path, args: argparse.Namespace) -> subprocess.Popen[bytes]:
    """tmpfs state folder, bindfs share; returns the bindfs process (in the foreground)."""
    for sub in ("state", "nas", "share", "inbox"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={args.state_mb}m", "tmpfs",
                    str(root / "state")], check=True)
    bindfs = subprocess.Popen(["bindfs", "-f", str(root / "nas"), str(root / "share")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_mounted(root / "share", bindfs)
    return bindfs


def tear_down(root: Path, bindfs: subprocess.Popen[bytes]) -> None:
    # The state tmpfs goes: keep a copy of the database to look into afterwards.
    shutil.copytree(root / "state", root / "state-final", dirs_exist_ok=True)
    os.kill(bindfs.pid, signal.SIGCONT)
    subprocess.run(["fusermount3", "-u", str(root / "share")], check=False)
    bindfs.wait(30)
    subprocess.run(["umount", str(root / "state")], check=False)


def config_extra(args: argparse.Namespace, receiver_url: str, http_port: int) -> dict[str, Any]:
    return {
        "inboxes": [{"path": "inbox"}, {"path": "share", "watch": "poll"}],
        "hooks": {
            "webhooks": [{"url": receiver_url, "name": "soak",
                          "timeout_seconds": 5}],
            "retry_backoff_seconds": 1, "retry_backoff_max_seconds": 15,
            "retention_days": args.retention_days,
        },
        "http": {"enabled": True, "host": "127.0.0.1", "port": http_port},
    }


def drop_all(ctx: Run, src: Path, inputs: list[Input], rng: random.Random) -> None:
    gaps = sorted(rng.uniform(0, ctx.args.drop_seconds) for _ in inputs)
    for item, at in zip(inputs, gaps, strict=True):
        delay = at - (time.monotonic() - ctx.started)
        if delay > 0:
            time.sleep(delay)
        if item.inbox == "share":  # the NAS's own folder: never hangs for the writer
            drop_one(src, ctx.root / "nas", item.name, rng)
        else:
            with ctx.drop_lock:
                drop_one(src, ctx.root / "inbox", item.name, rng)


def run(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="docinbox-longhaul-"))
    if root.exists() and any(root.iterdir()):
        print(f"longhaul: {root} is not empty", file=sys.stderr)
        return 2
    src = root / "src"
    src.mkdir(parents=True)
    t0 = time.monotonic()
    inputs = generate(src, args.files, rng)
    for x in inputs:  # ~1 in 8 documents arrives through the share
        if rng.random() < args.share_fraction:
            x.inbox = "share"
    generated = time.monotonic() - t0
    print(f"longhaul: generated {len(inputs)} inputs in {generated:.1f} s", flush=True)
    bindfs = set_up(root, args)
    receiver = Receiver().start()  # tests/hookreceiver.py: 204 to every event
    http_port = free_port()
    config = write_config(root, 0, config_extra(args, receiver.url, http_port))
    d = Daemon(root, config)
    d.start()
    started = time.monotonic()
    killer = Killer(d, root, args, started)
    ctx = Run(args, root, d, receiver, bindfs, http_port, started, killer, threading.Lock())
    sampler = Sampler(root, d, started, args.sample_seconds)
    sampler.thread.start()
    killer.start()
    restarter = Restarter(d, args.restart_seconds)
    restarter.thread.start()
    faults = Faults(ctx)
    fault_thread = threading.Thread(target=faults.run, daemon=True)
    fault_thread.start()
    stop_kills = threading.Timer(args.drop_seconds * args.fault_fraction, killer.stop)
    stop_kills.start()
    try:
        drop_all(ctx, src, inputs, rng)
        print(f"longhaul: all dropped at t={time.monotonic() - started:.0f}s", flush=True)
        fault_thread.join()
        stop_kills.join()
        quiet_from = round(time.monotonic() - started, 1) if not killer.kills else \
            max(k["t"] for k in killer.kills)
        settle(d, root, len(inputs), args.settle_timeout, [root / "inbox", root / "nas"])
        restarter.stopping.set()
        hooks_settled = wait_delivered(root, args.settle_timeout)
        sampler.stopping.set()
        sampler.thread.join()
        sampler.samples.append(take_sample(root, d, started))
        code = d.stop()
        duration = time.monotonic() - started
        problems = verify(root, inputs, code)
        if len(killer.kills) + len(killer.worker_kills) < args.kills:
            problems.append(f"only {len(killer.kills)} + {len(killer.worker_kills)} SIGKILLs, "
                            f"fewer than --kills {args.kills}: lengthen --drop-seconds")
        posts = [Post.of(r) for r in receiver.received()]
        problems += verify_hooks(root, posts, hooks_settled)
        summary = summarize(root, inputs, d, killer, code, duration, problems)
    finally:
        tear_down(root, bindfs)
    summary.update({
        "generated_seconds": round(generated, 1),
        "by_inbox": {i: sum(1 for x in inputs if x.inbox == i) for i in ("inbox", "share")},
        "faults": [asdict(f) for f in faults.done],
        "receiver": {"posts": len(posts), "distinct_ids": len({p.webhook_id for p in posts})},
        "quiet_from_seconds": quiet_from,
        "daemon_exits_by_itself": restarter.exits,
        "slopes": slopes(sampler.samples, quiet_from, args.warmup_seconds),
        "load_average": os.getloadavg(),
    })
    write_outputs(Path(args.out), sampler.samples, summary, faults.done)
    for p in problems:
        print(f"VIOLATION: {p}")
    print("longhaul: OK" if not problems else f"longhaul: FAILED ({len(problems)} violations)")
    print(json.dumps({k: v for k, v in summary.items() if k != "faults"}))
    return 0 if not problems else 1


def wait_delivered(root: Path, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = db_rows(root, "SELECT count(*) AS n FROM deliveries WHERE state != 'delivered'")
        if rows and rows[0]["n"] == 0:
            return True
        time.sleep(1)
    return False


@dataclass(frozen=True)
class Post:
    """One event as the receiver got it."""

    webhook_id: str
    event_id: str
    type: str
    job_id: int | None

    @staticmethod
    def of(r: Received) -> Post:
        body = json.loads(r.body)
        return Post(r.event_id, body.get("id", ""), body.get("type", ""),
                    (body.get("data") or {}).get("job_id"))


def verify_hooks(root: Path, posts: list[Post], settled: bool) -> list[str]:
    problems: list[str] = []
    if not settled:
        left = db_rows(root, "SELECT state, count(*) AS n FROM deliveries "
                             "WHERE state != 'delivered' GROUP BY state")
        problems.append(f"deliveries not all delivered: {[dict(r) for r in left]}")
    by_id: dict[str, set[tuple[str, str, int | None]]] = {}
    for g in posts:
        by_id.setdefault(g.webhook_id, set()).add((g.event_id, g.type, g.job_id))
    for wid, seen in by_id.items():
        if len(seen) != 1 or next(iter(seen))[0] != wid:
            problems.append(f"webhook-id {wid} carried {sorted(map(str, seen))}")
    got = {(g.type, g.job_id) for g in posts}
    for j in db_rows(root, "SELECT id, state FROM jobs"):
        if (f"document.{j['state']}", j["id"]) not in got:
            problems.append(f"job {j['id']} ({j['state']}): its event never reached the receiver")
    return problems


def fit(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope."""
    if len(xs) < 3:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else None


def slopes(samples: list[Sample], quiet_from: float, warmup: float) -> dict[str, Any]:
    """Slopes over the quiet phase (one daemon life), after `warmup` seconds of it."""
    s = [x for x in samples if x.t >= quiet_from + warmup and x.daemon_rss]
    last_pid = s[-1].daemon_pid if s else None
    s = [x for x in s if x.daemon_pid == last_pid]
    done = [float(x.done) for x in s]
    rss = fit(done, [float(x.daemon_rss or 0) for x in s])
    dbs = fit(done, [float(x.db_bytes) for x in s])
    return {
        "samples": len(s),
        "documents": int(done[-1] - done[0]) if s else 0,
        "daemon_rss_bytes_per_1000_docs": round(rss * 1000) if rss is not None else None,
        "db_bytes_per_doc": round(dbs, 1) if dbs is not None else None,
        "db_bytes_per_doc_overall": round(samples[-1].db_bytes / max(samples[-1].done, 1), 1),
        "wal_max_bytes": max(x.wal_bytes for x in samples),
        "daemon_rss_max": max(x.daemon_rss or 0 for x in samples),
        "worker_rss_max": max(x.worker_rss or 0 for x in samples),
        "daemon_fds_range": [min(x.daemon_fds or 0 for x in s), max(x.daemon_fds or 0 for x in s)]
        if s else None,
        "daemon_threads_range": [min(x.daemon_threads or 0 for x in s),
                                 max(x.daemon_threads or 0 for x in s)] if s else None,
    }


def write_outputs(out: Path, samples: list[Sample], summary: dict[str, Any],
                  faults: list[Fault]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(
        {"summary": summary, "samples": [asdict(s) for s in samples]}, indent=1) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s.t / 60 for s in samples]
    fig, ax = plt.subplots(4, 1, figsize=(9, 10), sharex=True)
    mib = 1 / (1 << 20)
    ax[0].plot(t, [(s.daemon_rss or 0) * mib for s in samples], label="daemon RSS")
    ax[0].plot(t, [(s.worker_rss or 0) * mib for s in samples], label="worker RSS")
    ax[0].set_ylabel("MiB")
    ax[1].plot(t, [s.db_bytes * mib for s in samples], label="database")
    ax[1].plot(t, [s.wal_bytes * mib for s in samples], label="WAL")
    ax[1].plot(t, [s.log_bytes * mib for s in samples], label="log")
    ax[1].set_ylabel("MiB")
    ax[2].plot(t, [s.daemon_fds or 0 for s in samples], label="daemon fds")
    ax[2].plot(t, [s.daemon_threads or 0 for s in samples], label="daemon threads")
    ax[2].plot(t, [s.worker_fds or 0 for s in samples], label="worker fds")
    ax[3].plot(t, [s.done for s in samples], label="documents finished")
    ax[3].plot(t, [s.queue for s in samples], label="queue")
    ax[3].set_xlabel("minutes")
    for f in faults:
        for a in ax:
            a.axvspan(f.start / 60, f.end / 60, alpha=0.15, color="red")
        ax[0].annotate(f.name, (f.start / 60, 0), fontsize=7, rotation=90, va="bottom")
    for a in ax:
        a.legend(loc="upper left", fontsize=8)
    fig.suptitle("docinbox long haul (lite): red = receiver down, disk full, hung share, "
                 "vanished inbox", fontsize=9)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=80)


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--files", type=int, default=5000)
    p.add_argument("--kills", type=int, default=20,
                   help="at least this many SIGKILLs of daemon and worker, or it fails")
    p.add_argument("--worker-kills", type=int, default=8)
    p.add_argument("--drop-seconds", type=float, default=3000)
    p.add_argument("--fault-fraction", type=float, default=0.6,
                   help="kills and faults happen in this first part of the drop period")
    p.add_argument("--min-gap", type=float, default=8)
    p.add_argument("--max-gap", type=float, default=30)
    p.add_argument("--share-fraction", type=float, default=0.12)
    p.add_argument("--state-mb", type=int, default=256)
    p.add_argument("--full-seconds", type=float, default=45)
    p.add_argument("--hang-seconds", type=float, default=120)
    p.add_argument("--vanish-seconds", type=float, default=30)
    p.add_argument("--receiver-down-seconds", type=float, default=60)
    p.add_argument("--retention-days", type=float, default=0.002)
    p.add_argument("--restart-seconds", type=float, default=15,
                   help="as systemd/docinbox.service's RestartSec")
    p.add_argument("--sample-seconds", type=float, default=10)
    p.add_argument("--warmup-seconds", type=float, default=60)
    p.add_argument("--settle-timeout", type=float, default=1800)
    p.add_argument("--seed", type=int, default=31)
    p.add_argument("--root", help="empty folder to run in (kept)")
    p.add_argument("--out", default="docs/longhaul", help="writes OUT.json and OUT.png")
    return run(p.parse_args())


if __name__ == "__main__":
    sys.exit(main())
