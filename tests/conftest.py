"""Shared fixtures: real daemon processes on temp folders."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest
import yaml

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "corpus"


def write_config(root: Path, **overrides: Any) -> Path:
    """A config for a daemon living entirely under `root`, fast timings for tests."""
    cfg: dict[str, Any] = {
        "inboxes": [{"path": "inbox"}],
        "outbox": "outbox",
        "archive": "archive",
        "failed": "failed",
        "duplicates": "duplicates",
        "state_dir": "state",
        "stability_seconds": 1,
        "rescan_seconds": 2,
        "engine": {"name": "lite", "fallback_engine": None, "dpi": 100},
        # An outbox fault is retried after 5 s (30 s by default): tests wait for that retry.
        "worker": {"heartbeat_seconds": 1, "restart_backoff_seconds": 0.5,
                   "output_retry_seconds": 5},
        "logging": {"level": "INFO"},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    (root / "inbox").mkdir(parents=True, exist_ok=True)
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def require_mounting(scratch: Path) -> None:
    """Skip the test unless this process may mount file systems (root with
    CAP_SYS_ADMIN, not forbidden by a container): a tmpfs is mounted on `scratch` and
    taken off again to find out."""
    if os.geteuid() != 0:
        pytest.skip(f"mounting needs root (CAP_SYS_ADMIN); running as uid {os.geteuid()}")
    scratch.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(scratch)],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        pytest.skip(f"mount is not permitted here: {r.stderr.strip()}")
    subprocess.run(["umount", str(scratch)], check=True)


def drop(src: Path, inbox: Path, name: str | None = None) -> Path:
    """Copy `src` into `inbox` the way a careful writer (a scanner, rsync) does: a hidden
    temporary name, then a rename, so the daemon never sees a half-written file."""
    final = inbox / (name or src.name)
    tmp = inbox / f".{final.name}.part"
    shutil.copyfile(src, tmp)
    os.rename(tmp, final)
    return final


def wait_for(
    cond: Callable[[], T | None],
    timeout: float,
    what: str,
    proc: subprocess.Popen[bytes] | None = None,
) -> T:
    """Poll `cond` until it returns something truthy. A bounded wait, not a timing test."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"daemon exited ({proc.returncode}) while waiting for {what}")
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def present(value: T | None) -> T:
    """`value`, failing the test when it is None (a lookup that must find something)."""
    assert value is not None
    return value


class DaemonProc:
    """`docinbox run` as a real child process, with helpers to read its state."""

    def __init__(self, root: Path, config: Path, env: dict[str, str] | None = None) -> None:
        self.root = root
        self.config = config
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = root / "daemon.log"

    def start(self) -> DaemonProc:
        env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", **self.env}
        self.logf = open(self.log, "ab")  # noqa: SIM115 - kept open for the process' life
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "daemon", "run", "--config", str(self.config)],
            cwd=self.root, env=env, stdout=self.logf, stderr=subprocess.STDOUT,
        )
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 90) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout)
        self.logf.close()
        return code

    def kill9(self) -> None:
        assert self.proc is not None
        # the whole group would also kill the worker; kill -9 of the daemon alone leaves
        # an orphaned worker, exactly as a real OOM kill of the main process would
        self.proc.kill()
        self.proc.wait(30)
        self.logf.close()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def jobs(self) -> list[dict[str, Any]]:
        db = self.root / "state" / "docinbox.sqlite3"
        if not db.exists():
            return []
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
        conn.row_factory = sqlite3.Row
        try:
            rows = conn.execute("SELECT * FROM jobs ORDER BY id").fetchall()
        except sqlite3.OperationalError:
            return []
        finally:
            conn.close()
        return [dict(r) for r in rows]

    def runtime(self) -> dict[str, Any]:
        db = self.root / "state" / "docinbox.sqlite3"
        if not db.exists():
            return {}
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
        try:
            rows = conn.execute("SELECT key, value FROM runtime").fetchall()
        except sqlite3.OperationalError:
            return {}
        finally:
            conn.close()
        return {k: json.loads(v) for k, v in rows}

    def states(self) -> dict[str, str]:
        return {Path(j["source_path"]).name: j["state"] for j in self.jobs()}

    def settled(self, n: int) -> bool:
        jobs = self.jobs()
        return len(jobs) >= n and all(
            j["state"] in ("done", "failed", "duplicate") for j in jobs
        )

    def wait_settled(self, n: int, timeout: float = 240) -> list[dict[str, Any]]:
        wait_for(lambda: self.settled(n), timeout, f"{n} jobs to finish", self.proc)
        return self.jobs()

    def outputs(self) -> list[Path]:
        out = self.root / "outbox"
        return sorted(p for p in out.rglob("*.md")) if out.exists() else []

    def meta(self, md: Path) -> dict[str, Any]:
        meta: dict[str, Any] = json.loads(md.with_name(md.stem + ".meta.json").read_text())
        return meta


class DaemonFactory(Protocol):
    """The `daemon_factory` fixture: a DaemonProc (not started) on a config under `root`
    (default: the test's tmp_path) with `overrides` laid over the test defaults."""

    def __call__(
        self, root: Path | None = None, env: dict[str, str] | None = None, **overrides: Any
    ) -> DaemonProc: ...


@pytest.fixture()
def daemon_factory(tmp_path: Path) -> Iterator[DaemonFactory]:
    started: list[DaemonProc] = []

    def make(root: Path | None = None, env: dict[str, str] | None = None,
             **overrides: Any) -> DaemonProc:
        r = root or tmp_path
        d = DaemonProc(r, write_config(r, **overrides), env=env)
        started.append(d)
        return d

    yield make
    for d in started:
        if d.proc is not None and d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait(30)
    # An orphaned worker of a kill -9'd daemon notices its pipe closing and exits.
