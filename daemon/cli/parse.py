"""`docinbox parse FILE...`: the daemon's own pipeline, once, on named files.

It reuses the real store, supervisor, worker and output code on a throw-away state folder,
so a one-shot run behaves exactly like the daemon (same engine loading, limits, timeouts,
crash handling) but never moves, deletes or archives the user's files.
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from daemon.common.errors import ExitCode
from daemon.common.live import Phase
from daemon.config.settings import Config
from daemon.intake.ingest import sha256_file
from daemon.jobs.states import TERMINAL, JobState
from daemon.jobs.store import Job, Store
from daemon.output.publish import Publisher
from daemon.supervisor.supervisor import Supervisor
from daemon.supervisor.worker_handle import GiveUp


class _KeepOriginals(Publisher):
    def failed(self, job: Job, kind: str, message: str) -> None:
        return None  # the error is printed; the user's file stays where it is


def parse_files(
    files: list[Path],
    outdir: Path,
    base: Config | None,
    *,
    engine: str | None = None,
    pages: str | None = None,
) -> int:
    missing = [f for f in files if not f.is_file()]
    for f in missing:
        print(f"docinbox: {f}: no such file", file=sys.stderr)
    files = [f.resolve() for f in files if f.is_file()]
    if not files:
        return ExitCode.NOT_FOUND
    outdir = outdir.resolve()
    outdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="docinbox-parse-") as tmp:
        t = Path(tmp)
        # Throw-away folders for everything but the output: parse never moves originals.
        folders: dict[str, Any] = {
            "outbox": outdir, "archive": t / "a", "failed": t / "f", "duplicates": t / "d",
            "state_dir": t / "state",
        }
        cfg = dataclasses.replace(
            base or Config(inboxes=(), **folders),
            inboxes=(), after_success="keep", on_duplicate="keep", **folders,
        )
        if engine:
            cfg = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, name=engine))
        if pages:
            cfg = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, pages=pages))
        store = Store.of(cfg)
        jobs: list[int] = []
        for f in files:
            st = f.stat()
            res = store.record_arrival(
                path=str(f),
                inbox=str(f.parent),
                subdir="",
                size=st.st_size,
                mtime_ns=st.st_mtime_ns,
                sha256=sha256_file(f),
                now=time.time(),
            )
            if res is not None:
                jobs.append(res.job.id)
        sup = Supervisor(
            cfg, store, _KeepOriginals(cfg, store, time.time), wall=time.time,
            give_up=_give_up(cfg),
        )
        code = _drive(sup, store, jobs, time.monotonic)
        store.close()
        return code


def _give_up(cfg: Config) -> GiveUp:
    """A person waits for `parse`: a worker that dies before its engine loads, as many
    times in a row as a document may crash it, ends the run instead of being restarted
    for ever (the daemon keeps trying; its status names the crash)."""
    return GiveUp(
        after=cfg.worker.max_attempts,
        see="the worker's messages above",
        hint=f"check the install of engine {cfg.engine.name!r} (bash scripts/setup.sh), "
        "or convert with another one (--engine lite)",
    )


def _drive(sup: Supervisor, store: Store, jobs: list[int], clock: Callable[[], float]) -> int:
    bar = tqdm(total=len(jobs), unit="doc", file=sys.stderr, disable=None)
    try:
        while True:
            sup.tick(clock())
            if sup.phase == Phase.FATAL:
                bar.close()
                print(f"docinbox: {sup.fatal_message}", file=sys.stderr)
                if sup.fatal_hint:
                    print(f"fix: {sup.fatal_hint}", file=sys.stderr)
                for job_id in jobs:
                    job = store.job(job_id)
                    if job is not None and job.state not in TERMINAL:
                        print(f"{job.source_path}: not converted (left as it was)",
                              file=sys.stderr)
                return ExitCode.ENGINE_UNAVAILABLE
            states = [store.job(j) for j in jobs]
            finished = sum(1 for j in states if j and j.state in TERMINAL)
            bar.n = finished
            cur = sup.snapshot().current
            if cur and cur.page:
                bar.set_postfix_str(f"{Path(cur.path).name} p{cur.page}/{cur.pages}")
            bar.refresh()
            if finished == len(jobs):
                break
            time.sleep(0.1)
    except KeyboardInterrupt:
        sup.request_stop(clock())
        while not sup.stopped:
            sup.tick(clock())
            time.sleep(0.1)
        return ExitCode.INTERRUPTED
    finally:
        bar.close()
    sup.request_stop(clock())
    while not sup.stopped:
        sup.tick(clock())
        time.sleep(0.05)
    code = ExitCode.OK
    for job_id in jobs:
        job = store.job(job_id)
        assert job is not None
        if job.state == JobState.DONE:
            print(f"{job.source_path} -> {job.output_dir}")
        elif job.state == JobState.DUPLICATE:
            print(f"{job.source_path}: same content as job {job.duplicate_of}, skipped")
        else:
            print(f"{job.source_path}: FAILED: {job.error_kind}: {job.error}", file=sys.stderr)
            code = ExitCode.FAILED_DOCUMENTS
    return code
