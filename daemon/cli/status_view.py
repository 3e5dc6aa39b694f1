"""`docinbox status` as text: what a person reads in a terminal.

The facts come from `Status` (daemon/service/status.py), collected once; this module only
words them, line by line: the engine and its precision, the worker, the page in progress,
the queue, hooks, disks, speed, each inbox and what waits or failed. `--json` prints the
same `Status` without this module.
"""

from __future__ import annotations

from pathlib import Path

from daemon import __version__
from daemon.common.display import safe_display
from daemon.common.live import InboxFacts, WorkerFacts
from daemon.common.units import age, gib, mib, since
from daemon.config.settings import LOSSY_PRECISIONS
from daemon.jobs.states import JobState
from daemon.service.status import Status

# What bench/fidelity.py measured for each precision's decoder: teacher-forced top-1
# agreement with fp32 on Qwen2.5-Coder-0.5B (MinerU2.5's decoder class) and SmolLM2-135M,
# in percent (docs/benchmarks.md, 2026-12-04); `docinbox status` shows it beside the
# precision. fp32 is the reference itself.
PRECISION_FIDELITY: dict[str, tuple[float, float]] = {
    "bf16": (99.79, 98.90),
    "mixed": (99.79, 98.90),
    "int8": (99.89, 98.90),
    "bf16-int8": (99.89, 98.90),
    "int8-dynamic": (92.47, 82.64),
    "bf16-int8-dynamic": (92.47, 82.64),
}


def render_status(st: Status) -> str:
    """`docinbox status` as text: what a person reads in a terminal."""
    out: list[str] = []
    live = st.live
    out.append(
        f"docinbox {(live.version if live else None) or __version__}: running "
        f"(pid {live.pid if live else None}, up {age(st.uptime or 0)})"
        if st.running
        else "docinbox: NOT running"
    )
    out.extend(engine_lines(st))
    w = st.worker
    if st.running:
        beat = w.last_heartbeat_age
        out.append(
            f"worker:  {w.phase}, RSS {mib(w.rss)} (peak {mib(w.peak_rss)}), "
            f"{w.restarts or 0} restart(s) after a crash"
            + (f", {w.switches} engine switch(es)" if w.switches else "")
            + (f", last heartbeat {age(beat)} ago" if beat is not None else "")
        )
        out.extend(crash_lines(w))
    cur = st.current
    if cur:
        now_line = f"now:     job {cur.job_id} {safe_display(Path(cur.path).name)}"
        if cur.page:
            now_line += f", page {cur.page}/{cur.pages}"
        now_line += page_step(cur.stage, cur.block)
        if cur.pages_in_flight > 1:
            now_line += f" ({cur.pages_in_flight} pages in flight)"
        if cur.eta_seconds is not None:
            now_line += f", about {age(cur.eta_seconds)} left"
        out.append(now_line)
    q = st.queue
    if q is None:
        out.append(f"queue:   ? ({st.store_error})")
    else:
        queue_age = st.queue_age_seconds
        out.append(
            "queue:   "
            + ", ".join(f"{q.counts.get(s.value, 0)} {s.value}" for s in JobState)
            + (f"; oldest waiting {age(queue_age)}" if queue_age is not None else "")
        )
        k = q.counters
        out.append(
            f"totals:  {int(k.get('pages_total', 0))} pages processed, "
            f"{int(k.get('duplicates_total', 0))} duplicates skipped"
        )
    if q is not None and q.deliveries is not None:
        out.extend(hook_lines(st))
    out.append(
        "disk:    "
        + ", ".join(
            f"{d.name} {'?' if d.free is None else gib(d.free)} free" for d in st.disks
        )
    )
    if st.seconds_per_page is not None:
        eta = st.eta_seconds
        out.append(
            f"speed:   {st.seconds_per_page:.1f} s/page" + (f"; ETA ~{age(eta)}" if eta else "")
        )
    for ib in st.inboxes:
        out.extend(inbox_lines(ib, st.now))
    for gone in st.missing_folders:
        when = f" {since(gone.missing_since, st.now)}" if gone.missing_since is not None else ""
        out.append(
            f"MISSING: {gone.name} {safe_display(gone.path)}{when}: {gone.missing}; documents "
            "wait until it returns"
        )
    if q is not None:
        for wt in q.waiting:
            name = safe_display(Path(wt.path).name)
            out.append(f"waiting: job {wt.job_id} {name}: {wt.error}")
        if q.recent_failures:
            out.append("recent failures:")
            for f in q.recent_failures:
                name = safe_display(Path(f.path).name)
                out.append(f"  job {f.job_id} {name}: {f.kind}: {f.error}")
    return "\n".join(out)


def engine_lines(st: Status) -> list[str]:
    """The engine in `docinbox status`: which one, its precision and how faithful that
    is, where it runs; why a fallback stands in, or why the daemon stopped."""
    eng = st.engine
    line = f"engine:  {eng.name or st.configured_engine}"
    if eng.model_id:
        line += f" ({eng.model_id}"
        lossy = " (lossy)" if eng.precision in LOSSY_PRECISIONS else ""
        line += f", precision {eng.precision}{lossy})" if eng.precision else ")"
    if eng.runtime and eng.runtime != "transformers":
        line += f", runtime {eng.runtime}" + (f" on {eng.server}" if eng.server else "")
    out = [line]
    fidelity = PRECISION_FIDELITY.get(eng.precision or "")
    if eng.model_id and fidelity and eng.runtime in ("", None, "transformers"):
        verdict = "FAILS" if eng.precision in LOSSY_PRECISIONS else "passes"
        out.append(
            f"  fidelity: decoder top-1 vs fp32 {fidelity[0]:.2f} % (Qwen2.5-0.5B), "
            f"{fidelity[1]:.2f} % (SmolLM2-135M): {verdict} the gate (bench/fidelity.py)"
        )
    if eng.estimate is not None:
        out.append(f"  estimate: {eng.estimate.describe()}")
        warning = eng.estimate.warning()
        if warning:
            out.append(f"  SLOW: {warning}")
    if st.fallback_reason:
        out.append(f"  FALLBACK: {st.fallback_reason}")
        out.append(f"  fix: {st.fallback_fix}")
    if st.fatal:
        out.append(f"  STOPPED: {st.fatal}")
    return out


def crash_lines(w: WorkerFacts) -> list[str]:
    """Why the worker died: a worker that dies while loading its engine never takes a
    document, so no failed job would say so; status does, with how often and when the
    next try is."""
    if not w.last_crash:
        return []
    if not w.failed_starts:
        return [f"  last crash: {w.last_crash}"]
    times = "once" if w.failed_starts == 1 else f"{w.failed_starts} times in a row"
    nxt = f"; next start in {age(w.next_start_in)}" if w.next_start_in is not None else ""
    return [
        f"  CRASHING: {w.last_crash} ({times}){nxt}; its last words are in the daemon's log "
        "(stderr or journalctl -u docinbox)"
    ]


def hook_lines(st: Status) -> list[str]:
    """Hooks in `docinbox status`: what waits, what was given up, why a receiver fails."""
    assert st.queue is not None and st.queue.deliveries is not None
    d = st.queue.deliveries
    oldest = st.hooks_oldest_pending_age
    lines = [
        f"hooks:   {d.pending} waiting"
        + (f" (oldest {age(oldest)})" if oldest is not None else "")
        + f", {d.dead} given up, {d.delivered} delivered, {d.failed_attempts} failed attempts"
    ]
    for r in d.receivers:
        line = f"  {r.name}: {r.pending} waiting, {r.dead} given up"
        if r.disabled:
            line += f"; DISABLED ({r.disabled}) until reload or restart"
        if not r.configured:
            line += "; no longer configured"
        if r.last_error:
            line += f"; last error: {r.last_error}"
        lines.append(line)
    if d.dead:
        lines.append(
            "  `docinbox hooks` lists them; `docinbox hooks retry --dead` sends them again"
        )
    return lines


def inbox_lines(ib: InboxFacts, now: float | None = None) -> list[str]:
    """One inbox in `docinbox status`: its observer, files settling, files it ignores;
    or that it is missing, since when (`now`: the wall clock)."""
    if ib.missing is not None:
        when = (
            f" {since(ib.missing_since, now)}"
            if ib.missing_since is not None and now is not None
            else ""
        )
        return [
            f"inbox:   {safe_display(ib.path)} (MISSING{when}: {ib.missing}; watching for "
            "it to return)"
        ]
    busy = ""
    if ib.pending:
        busy += f", {ib.pending} settling"
    if ib.open_for_write:
        busy += f", {ib.open_for_write} still being written"
    lines = [f"inbox:   {ib.path} ({ib.observer}{busy})"]
    if ib.ignored:
        more = ", …" if ib.ignored > len(ib.ignored_names) else ""
        plural = "file" if ib.ignored == 1 else "files"
        lines.append(
            f"         {ib.ignored} {plural} ignored in inbox: not a document type: "
            + ", ".join(ib.ignored_names)
            + more
        )
    return lines


def page_step(stage: str | None, block: tuple[int, int] | None) -> str:
    """Where the engine is inside the page, for `status`: ", layout step" while MinerU
    reads the page layout, ", block k/K" while it recognises the blocks."""
    if stage == "layout":
        return ", layout step"
    if block and block[1] > 0:
        noun = stage if stage and stage != "block" else "block"
        return f", {noun} {block[0]}/{block[1]}"
    return ""
