"""Shares come and go under the running daemon: noticed, reported, watched again at once.

Real folders and real mounts under a real `docinbox run` with the shipped
`rescan_seconds: 300`, so nothing here can pass by waiting for a periodic rescan:

- the inbox folder moved away and moved back, moved away and created anew, and replaced
  by a new folder at once (what a remount or a renamed share looks like);
- a bind mount and a tmpfs mounted on the inbox, unmounted and mounted again (root only;
  skipped with the reason elsewhere): while unmounted the folder is the bare mount point,
  and a file written into it is not taken;
- a bindfs FUSE mount whose process is killed (the mount then answers "Transport endpoint
  is not connected") and started again.

For each: the warning and `docinbox status` while the inbox is away, a file dropped after
its return queued within 10 s, nothing processed twice, and a file that was in the inbox
throughout (`after_success: keep` leaves it there) taken exactly once.

And a share that hangs instead of vanishing (a bindfs whose process is stopped with
SIGSTOP: every call into it blocks, as on a hard NFS mount whose server is down): an
inbox on it while another, local one converts; the outbox on it, where documents wait.
`/healthz` answers within 2 s throughout and names the share; SIGCONT ends the hang and
its files are taken without a restart. The share always gets SIGCONT and is unmounted
in the fixture's teardown, whatever the test did.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.cli.test_cli import cli
from tests.conftest import DaemonFactory, DaemonProc, require_mounting, wait_for
from tests.docgen import make_text_pdf
from tests.hookreceiver import free_port

pytestmark = pytest.mark.integration

# The bound the issue sets for a file dropped after the inbox returns: a look every 2 s,
# `stability_seconds: 1`, hashing; the periodic rescan is 300 s away.
QUEUED_WITHIN = 10.0


def start_daemon(daemon_factory: DaemonFactory, **overrides: Any) -> DaemonProc:
    d = daemon_factory(rescan_seconds=300, after_success="keep", **overrides).start()
    wait_for(lambda: d.runtime().get("phase") == "idle", 120, "the worker", d.proc)
    return d


def job_names(d: DaemonProc) -> collections.Counter[str]:
    return collections.Counter(Path(j["source_path"]).name for j in d.jobs())


def inbox_facts(d: DaemonProc) -> dict[str, Any]:
    facts: dict[str, Any] = d.runtime().get("inboxes", [{}])[0]
    return facts


def wait_missing(d: DaemonProc, warning: str) -> str:
    """Wait for the warning and for status to say the inbox is missing; the status text."""
    t0 = time.monotonic()
    wait_for(lambda: warning in d.output(), 15, f"the warning {warning!r}", d.proc)
    print(f"warned {time.monotonic() - t0:.1f} s after the inbox went away")
    wait_for(lambda: inbox_facts(d).get("missing"), 15, "status: inbox missing", d.proc)
    status = cli("status", "--config", str(d.config)).stdout
    assert "(MISSING since " in status, status
    return status


def drop_and_expect_queued(d: DaemonProc, folder: Path, name: str, text: str) -> None:
    make_text_pdf(folder / name, [[text]])
    t0 = time.monotonic()
    wait_for(lambda: job_names(d)[name] == 1, QUEUED_WITHIN,
             f"{name} queued within {QUEUED_WITHIN:.0f} s of being dropped", d.proc)
    print(f"{name} queued {time.monotonic() - t0:.1f} s after it was dropped")


def assert_each_taken_once(d: DaemonProc, *names: str) -> None:
    d.wait_settled(len(names))
    assert job_names(d) == collections.Counter(names), d.jobs()
    assert all(j["state"] == "done" for j in d.jobs()), d.jobs()


# -------------------------------------------------------------------- folders moved


@pytest.mark.parametrize("how", ["moved back", "created anew", "replaced at once"])
def test_inbox_folder_going_away_and_returning(
    tmp_path: Path, daemon_factory: DaemonFactory, how: str
) -> None:
    inbox, away = tmp_path / "inbox", tmp_path / "away"
    d = start_daemon(daemon_factory)
    make_text_pdf(inbox / "throughout.pdf", [["Present throughout heron"]])
    d.wait_settled(1)
    assert inbox_facts(d)["observer"] == "events"

    os.rename(inbox, away)
    if how == "replaced at once":
        inbox.mkdir()  # no gap to see: a new inode at the same path
        wait_for(lambda: "was replaced by another folder" in d.output()
                 or "is back after" in d.output(), 15, "the replacement noticed", d.proc)
    else:
        status = wait_missing(d, "is gone (unmounted?): watching for it to return")
        assert "gone (unmounted?)" in status
        if how == "moved back":
            os.rename(away, inbox)  # the same folder, throughout.pdf still in it
        else:
            inbox.mkdir()
            shutil.copy2(away / "throughout.pdf", inbox / "throughout.pdf")  # same bytes
    drop_and_expect_queued(d, inbox, "after.pdf", "Dropped after the return otter")
    if how != "replaced at once":
        assert "is back after" in d.output()
    assert_each_taken_once(d, "throughout.pdf", "after.pdf")
    facts = inbox_facts(d)
    assert facts["missing"] is None and facts["observer"] == "events", facts
    assert d.output().count("watching with events") == 2  # a fresh observer, chosen again
    assert d.stop() == 0


# -------------------------------------------------------------------- real mounts


Mounter = Callable[[list[str], Path], None]


def mounted_at(path: Path) -> bool:
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return any(line.split()[4] == str(path) for line in lines)


@pytest.fixture()
def mounter(tmp_path: Path) -> Iterator[Mounter]:
    """`mount(args, target)`; skips the test when mounting is not permitted here."""
    probe = tmp_path / ".mount-probe"
    require_mounting(probe)
    probe.rmdir()
    targets: list[Path] = []

    def mount(args: list[str], target: Path) -> None:
        subprocess.run(["mount", *args, str(target)], check=True)
        targets.append(target)

    yield mount
    for target in reversed(targets):
        while mounted_at(target):
            if subprocess.run(["umount", "-l", str(target)], check=False).returncode:
                break


@pytest.mark.parametrize("kind", ["bind", "tmpfs"])
def test_share_unmounted_and_mounted_again_under_the_daemon(
    tmp_path: Path, daemon_factory: DaemonFactory, mounter: Mounter, kind: str
) -> None:
    inbox, share = tmp_path / "inbox", tmp_path / "share"
    inbox.mkdir()
    share.mkdir()
    # A bind mount of a folder of the same file system keeps the device: only the mount
    # table tells it is a mount point. A tmpfs has a device of its own.
    args = ["--bind", str(share)] if kind == "bind" else ["-t", "tmpfs", "-o", "size=8m",
                                                          "tmpfs"]
    mounter(args, inbox)
    d = start_daemon(daemon_factory)
    make_text_pdf(inbox / "throughout.pdf", [["Present throughout heron"]])
    d.wait_settled(1)

    subprocess.run(["umount", str(inbox)], check=True)
    status = wait_missing(d, "is not mounted (what is there is the empty mount point")
    assert "not mounted" in status
    # A scanner writing into the bare mount point meanwhile: not the inbox, not taken.
    make_text_pdf(inbox / "stray.pdf", [["Written into the bare mount point"]])
    deadline = time.monotonic() + 6  # three looks at the folder, at least
    while time.monotonic() < deadline:
        assert "stray.pdf" not in job_names(d)
        time.sleep(0.5)
    assert inbox_facts(d)["missing"], inbox_facts(d)

    mounter(args, inbox)  # the share is back (and hides stray.pdf under it)
    drop_and_expect_queued(d, inbox, "after.pdf", "Dropped after the return otter")
    assert "is back after" in d.output()
    assert_each_taken_once(d, "throughout.pdf", "after.pdf")
    assert inbox_facts(d)["missing"] is None
    assert d.stop() == 0


# -------------------------------------------------------------------- FUSE


def start_bindfs(source: Path, mnt: Path) -> subprocess.Popen[bytes]:
    # -f: in the foreground, so the test holds the pid it kills (no search by name).
    proc = subprocess.Popen(["bindfs", "-f", str(source), str(mnt)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_for(lambda: mounted_at(mnt) or proc.poll() is not None, 30, "bindfs to mount")
    if proc.poll() is not None:
        err = proc.stderr.read().decode() if proc.stderr else ""
        pytest.skip(f"cannot mount bindfs here: {err.strip() or proc.returncode}")
    return proc


def fuse_unmount(mnt: Path) -> None:
    for cmd in (["fusermount3", "-uz", str(mnt)], ["fusermount", "-uz", str(mnt)],
                ["umount", "-l", str(mnt)]):
        if not mounted_at(mnt):
            return
        if shutil.which(cmd[0]):
            subprocess.run(cmd, capture_output=True, check=False)


def fuse_folders(tmp_path: Path) -> tuple[Path, Path]:
    """The NAS's own folder and the empty mount point for bindfs; skips the test where
    FUSE cannot run."""
    if shutil.which("bindfs") is None:
        pytest.skip("bindfs not installed (bash scripts/setup.sh --dev)")
    if not os.path.exists("/dev/fuse"):
        pytest.skip("no /dev/fuse on this machine (containers need --device /dev/fuse)")
    source, mnt = tmp_path / "nas", tmp_path / "mnt"
    source.mkdir()
    mnt.mkdir()
    return source, mnt


def test_fuse_share_killed_and_started_again(
    tmp_path: Path, daemon_factory: DaemonFactory
) -> None:
    source, mnt = fuse_folders(tmp_path)
    fuse = start_bindfs(source, mnt)
    try:
        d = start_daemon(daemon_factory, inboxes=[{"path": str(mnt)}])
        assert inbox_facts(d)["observer"] == "poll"  # a FUSE mount: polled
        make_text_pdf(mnt / "throughout.pdf", [["Present throughout heron"]])
        d.wait_settled(1)

        fuse.kill()  # the FUSE process dies; the kernel mount stays, dead
        fuse.wait(30)
        status = wait_missing(
            d, "is gone (unmounted? Transport endpoint is not connected): watching for it "
            "to return")
        assert "Transport endpoint is not connected" in status
        fuse_unmount(mnt)
        fuse = start_bindfs(source, mnt)
        drop_and_expect_queued(d, mnt, "after.pdf", "Dropped after the return otter")
        assert "is back after" in d.output()
        assert_each_taken_once(d, "throughout.pdf", "after.pdf")
        facts = inbox_facts(d)
        assert facts["missing"] is None and facts["observer"] == "poll", facts
        assert d.stop() == 0
    finally:
        if fuse.poll() is None:
            fuse.terminate()
            fuse.wait(30)
        fuse_unmount(mnt)


def test_outbox_unmounted_makes_documents_wait_not_fail(
    tmp_path: Path, daemon_factory: DaemonFactory, mounter: Mounter
) -> None:
    outbox = tmp_path / "outbox"
    outbox.mkdir()
    args = ["-t", "tmpfs", "-o", "size=8m", "tmpfs"]
    mounter(args, outbox)
    d = start_daemon(daemon_factory)
    make_text_pdf(tmp_path / "inbox" / "before.pdf", [["Before the outage heron"]])
    d.wait_settled(1)

    subprocess.run(["umount", str(outbox)], check=True)
    wait_for(lambda: "the outbox (" in d.output()
             and "documents wait in the queue until it returns" in d.output(), 15,
             "the outbox warning", d.proc)
    status = cli("status", "--config", str(d.config)).stdout
    assert "MISSING: outbox " in status and "not mounted" in status, status
    make_text_pdf(tmp_path / "inbox" / "meanwhile.pdf", [["During the outage otter"]])
    wait_for(lambda: job_names(d)["meanwhile.pdf"] == 1, 30, "meanwhile.pdf queued", d.proc)
    deadline = time.monotonic() + 5  # it would start within a tick if nothing held it
    while time.monotonic() < deadline:
        assert d.states()["meanwhile.pdf"] == "queued", d.jobs()
        time.sleep(0.5)
    assert not (outbox / "meanwhile").exists()  # nothing written into the bare folder

    mounter(args, outbox)
    assert_each_taken_once(d, "before.pdf", "meanwhile.pdf")
    assert "is back after" in d.output()
    assert any(p.stem == "meanwhile" for p in d.outputs())
    assert d.stop() == 0


# -------------------------------------------------------------------- a share that hangs


class FuseShare:
    """A bindfs mount whose process the test stops and resumes: stopped with SIGSTOP,
    every call into the mount blocks, exactly as on a hard NFS mount whose server is
    down (the kernel waits for an answer that does not come); SIGCONT ends it."""

    def __init__(self, source: Path, mnt: Path) -> None:
        self.source = source
        self.mnt = mnt
        self.proc = start_bindfs(source, mnt)

    def hang(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def answer(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)

    def close(self) -> None:
        self.answer()  # always: a stopped bindfs would leave a mount nothing can touch
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)
        fuse_unmount(self.mnt)


@pytest.fixture()
def fuse_share(tmp_path: Path) -> Iterator[FuseShare]:
    """Request it after `daemon_factory`: torn down first, so the share answers again
    (and is unmounted) before anything else looks at it, whatever the test did."""
    share = FuseShare(*fuse_folders(tmp_path))
    try:
        yield share
    finally:
        share.close()


def healthz(port: int) -> dict[str, Any]:
    """/healthz, which must answer within 2 s whatever hangs."""
    t0 = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as resp:
        body: dict[str, Any] = json.loads(resp.read())
    took = time.monotonic() - t0
    assert took < 2.0, f"/healthz took {took:.1f} s"
    return body


def recorded_after(d: DaemonProc, seen: float) -> bool:
    """The daemon recorded its status after `seen`: its main loop ticked."""
    return bool(d.runtime()["updated_at"] > seen)


def restarts(d: DaemonProc) -> int:
    return int(d.runtime().get("worker_restarts") or 0)


def test_an_inbox_on_a_hung_share_holds_only_itself(
    tmp_path: Path, daemon_factory: DaemonFactory, fuse_share: FuseShare
) -> None:
    port = free_port()
    d = start_daemon(daemon_factory, inboxes=[{"path": "inbox"}, {"path": str(fuse_share.mnt)}],
                     http={"enabled": True, "port": port})
    make_text_pdf(fuse_share.mnt / "before.pdf", [["On the share before the hang heron"]])
    d.wait_settled(1)
    assert healthz(port)["status"] == "ok"

    fuse_share.hang()
    t0 = time.monotonic()
    reasons = wait_for(
        lambda: [r for r in healthz(port)["reasons"]
                 if str(fuse_share.mnt) in r and "not answering" in r],
        15, "/healthz naming the hung share", d.proc)
    print(f"/healthz named it {time.monotonic() - t0:.1f} s after the hang: {reasons}")
    assert healthz(port)["shares_not_answering"] == [str(fuse_share.mnt)]
    # Written on the NAS itself (its own disk answers): taken once the share answers.
    make_text_pdf(fuse_share.source / "meanwhile.pdf", [["Written during the hang otter"]])
    # The other inbox goes on: a scan dropped there converts during the hang.
    make_text_pdf(tmp_path / "inbox" / "local.pdf", [["Dropped locally during the hang"]])
    wait_for(lambda: d.states().get("local.pdf") == "done", 60,
             "local.pdf converted during the hang", d.proc)
    assert "meanwhile.pdf" not in d.states()
    assert healthz(port)["status"] == "degraded"
    facts = [ib for ib in d.runtime()["inboxes"] if ib["path"] == str(fuse_share.mnt)]
    assert facts and facts[0]["answering"] is False, facts
    assert d.output().count(f"inbox {fuse_share.mnt} is not answering") == 1  # said once

    fuse_share.answer()
    wait_for(lambda: d.states().get("meanwhile.pdf") == "done", 60,
             "meanwhile.pdf taken after the share answered, without a restart", d.proc)
    wait_for(lambda: healthz(port)["status"] == "ok", 15, "/healthz ok again", d.proc)
    assert "is back after" in d.output()
    assert_each_taken_once(d, "before.pdf", "local.pdf", "meanwhile.pdf")
    assert restarts(d) == 0  # the worker's heartbeats were read throughout
    assert d.stop() == 0


def test_an_outbox_on_a_hung_share_makes_documents_wait(
    tmp_path: Path, daemon_factory: DaemonFactory, fuse_share: FuseShare
) -> None:
    d = start_daemon(daemon_factory, outbox=str(fuse_share.mnt))
    inbox = tmp_path / "inbox"
    make_text_pdf(inbox / "before.pdf", [["Before the hang heron"]])
    d.wait_settled(1)

    fuse_share.hang()

    def outbox_facts() -> dict[str, Any]:
        return next(f for f in d.runtime().get("folders", []) if f["name"] == "outbox")

    wait_for(lambda: outbox_facts()["answering"] is False, 15,
             "the outbox's share not answering", d.proc)
    assert "not answering" in outbox_facts()["missing"]
    make_text_pdf(inbox / "meanwhile.pdf", [["During the hang otter"]])
    wait_for(lambda: d.states().get("meanwhile.pdf") == "queued", 30,
             "meanwhile.pdf queued", d.proc)
    # The loop goes on and the document stays queued: three status records later (one
    # each 2 s, or sooner), nothing started it and nothing failed it.
    for _ in range(3):
        seen: float = d.runtime()["updated_at"]
        wait_for(partial(recorded_after, d, seen), 15, "the loop ticking", d.proc)
        assert d.states()["meanwhile.pdf"] == "queued", d.jobs()
    assert not any(p.name.startswith("meanwhile") for p in fuse_share.source.iterdir())

    fuse_share.answer()
    assert_each_taken_once(d, "before.pdf", "meanwhile.pdf")
    assert any(p.name.startswith("meanwhile") for p in fuse_share.source.iterdir())
    assert "is back after" in d.output()
    assert restarts(d) == 0
    assert d.stop() == 0


def test_a_reload_while_a_share_hangs_is_refused_and_the_loop_goes_on(
    tmp_path: Path, daemon_factory: DaemonFactory, fuse_share: FuseShare
) -> None:
    """SIGHUP's folder checks go through the share lanes: a hung inbox is reported like a
    vanished one (the reload is refused, the running configuration stays) instead of
    freezing the main loop in a stat, and once it answers, a reload applies.

    SIGHUP is sent once the share is marked: right after SIGSTOP the kernel may still
    answer a stat of the mount from its attribute cache, and the reload would pass."""
    d = start_daemon(daemon_factory, inboxes=[{"path": "inbox"}, {"path": str(fuse_share.mnt)}])

    assert d.proc is not None
    fuse_share.hang()
    wait_for(lambda: [ib for ib in d.runtime()["inboxes"] if ib["answering"] is False], 30,
             "the hung share marked", d.proc)
    t0 = time.monotonic()
    d.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "reload refused" in d.output(), 15, "the reload refused", d.proc)
    print(f"reload refused {time.monotonic() - t0:.1f} s after SIGHUP")
    refused = d.output().split("reload refused", 1)[1]
    assert f"inbox {fuse_share.mnt} is not answering" in refused, refused
    # The loop goes on after the reload: it records its status, the local inbox converts.
    seen: float = d.runtime()["updated_at"]
    wait_for(partial(recorded_after, d, seen), 15, "the loop ticking", d.proc)
    make_text_pdf(tmp_path / "inbox" / "local.pdf", [["Dropped locally after the reload"]])
    wait_for(lambda: d.states().get("local.pdf") == "done", 60,
             "local.pdf converted during the hang", d.proc)

    fuse_share.answer()
    wait_for(lambda: "is back after" in d.output(), 30, "the share answering again", d.proc)
    d.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "configuration reloaded" in d.output(), 30, "the reload applied", d.proc)
    assert restarts(d) == 0
    assert d.stop() == 0


def test_healthz_answers_while_the_outbox_hangs_before_the_share_is_marked(
    tmp_path: Path, daemon_factory: DaemonFactory, fuse_share: FuseShare
) -> None:
    """The HTTP thread asks for the outbox's free space through its share's lane with a
    short patience: from the first moment of the hang, before the main loop's deadline
    marks the share, /healthz answers within 2 s (`healthz` asserts it)."""
    port = free_port()
    d = start_daemon(daemon_factory, outbox=str(fuse_share.mnt),
                     http={"enabled": True, "port": port})
    assert healthz(port)["disk_free_bytes"]["outbox"] is not None

    fuse_share.hang()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 12.0:  # the deadline (10 s) and a little more
        body = healthz(port)
    print(f"/healthz after {time.monotonic() - t0:.1f} s of hang: {body['reasons']}")
    wait_for(lambda: healthz(port)["shares_not_answering"] == [str(fuse_share.mnt)], 15,
             "/healthz naming the hung outbox", d.proc)
    assert healthz(port)["disk_free_bytes"]["outbox"] is None

    fuse_share.answer()
    wait_for(lambda: healthz(port)["disk_free_bytes"]["outbox"] is not None, 30,
             "the outbox's free space known again", d.proc)
    assert restarts(d) == 0
    assert d.stop() == 0
