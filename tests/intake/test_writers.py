"""Real writers against the real daemon: every file is taken exactly once, and only whole.

Each test drives a real program that puts files into an inbox the way NAS boxes and
scanners do, while `docinbox run` watches:

- rsync (temp name `.name.XXXXXX`, then rename), throttled with --bwlimit;
- cp of a large file, and a slow appender that pauses longer than a second between writes;
- Samba's smbd on 127.0.0.1 (writes in place under the final name) fed by smbclient through
  a throttling TCP proxy, so a large upload takes seconds;
- vsftpd on 127.0.0.1 (also in place) fed by `curl -T --limit-rate`;
- a bindfs FUSE mount whose source folder is written behind its back: no inotify event
  ever arrives, so `watch: auto` must pick polling by itself.

"Exactly once, only whole" is checked directly: while the writer runs there is no job for
the file; at the end there is one job per file, `done`, its recorded sha256/size are those
of the complete file, and its Markdown holds the file's known text.

All servers listen on 127.0.0.1 only, on free high ports, with private configurations in
the test's temp folder. A test skips (with the reason) only when the machine cannot run the
program: not installed (`bash scripts/setup.sh --dev` installs them), not root, no /dev/fuse.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DaemonFactory, DaemonProc, wait_for
from tests.docgen import make_text_pdf, pdf_stream, write_pdf

pytestmark = pytest.mark.integration

MB = 1024 * 1024


# ---------------------------------------------------------------------------- documents


def make_big_pdf(path: Path, lines: list[str], pad_bytes: int) -> Path:
    """A valid one-page text PDF made large by an unused stream of random bytes.

    The padding object comes BEFORE the page, so a file cut anywhere in the padding has no
    page and no text at all: a document taken early cannot pass the text check by luck.
    """
    content = b"\n".join(
        b"BT /F1 14 Tf 72 %d Td (%s) Tj ET" % (720 - 24 * i, line.encode("latin-1"))
        for i, line in enumerate(lines)
    )
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [5 0 R] /Count 1 >>",
        pdf_stream(os.urandom(pad_bytes)),  # never referenced: padding only
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
        b"/Resources << /Font << /F1 4 0 R >> >> /Contents 6 0 R >>",
        pdf_stream(content),
    ]
    return write_pdf(path, objects)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(MB):
            h.update(chunk)
    return h.hexdigest()


class Expected:
    """What each file must become: its name, content hash and a phrase of its text."""

    def __init__(self) -> None:
        self.files: dict[str, tuple[str, int, str]] = {}

    def add(self, path: Path, phrase: str) -> Path:
        self.files[path.name] = (sha256_of(path), path.stat().st_size, phrase)
        return path


def job_rows(d: DaemonProc) -> list[dict[str, Any]]:
    db = d.root / "state" / "docinbox.sqlite3"
    if not db.exists():
        return []
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    conn.row_factory = sqlite3.Row
    try:
        rows = conn.execute(
            "SELECT jobs.*, documents.sha256 AS sha256, documents.size AS size FROM jobs "
            "JOIN documents ON documents.id = jobs.document_id ORDER BY jobs.id"
        ).fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()
    return [dict(r) for r in rows]


def wait_looked_at_again(d: DaemonProc, since: float, noticed: str | None = None) -> None:
    """Wait for status facts, recorded after `since` (wall clock), in which no inbox holds a
    file pending (settling before it is taken) and each inbox was looked at anew: scanned
    completely after `since` or, where no periodic rescan comes, seen to hold `noticed` (a
    file of no document type put there after `since`, listed as left alone). A file taken
    a second time would have to come from the inbox again: once it was looked at anew and
    nothing in it waits to be taken, no late job can follow."""

    def looked_at_again() -> bool:
        rt = d.runtime()
        inboxes = rt.get("inboxes") or []
        return (rt.get("updated_at") or 0) >= since and bool(inboxes) and all(
            ib["pending"] == 0
            and (
                noticed in ib["ignored_names"] if noticed
                else (ib.get("scanned_at") or 0) >= since
            )
            for ib in inboxes
        )

    wait_for(looked_at_again, 60, "the inboxes looked at again with nothing pending", d.proc)


def assert_each_taken_once_and_whole(
    d: DaemonProc, expected: Expected, noticed: str | None = None
) -> None:
    """One job per file, done, with the full file's hash and size, and its text.

    `noticed`: see wait_looked_at_again (the caller put it there after the files)."""
    d.wait_settled(len(expected.files), timeout=240)
    # a late second job (a file taken twice) would show up by then
    wait_looked_at_again(d, time.time(), noticed)
    jobs = job_rows(d)
    names = sorted(Path(j["source_path"]).name for j in jobs)
    assert names == sorted(expected.files), (names, d.output()[-3000:])
    for j in jobs:
        name = Path(j["source_path"]).name
        sha, size, phrase = expected.files[name]
        assert j["state"] == "done", (name, j["state"], j["error"], d.output()[-3000:])
        assert (j["sha256"], j["size"]) == (sha, size), f"{name} was taken before it was whole"
        md = Path(j["output_dir"]) / f"{Path(j['output_dir']).name}.md"
        assert phrase in md.read_text(), (name, md.read_text()[:500])


def wait_writer(d: DaemonProc, writer: subprocess.Popen[bytes], name: str | None,
                timeout: float) -> float:
    """Wait for `writer`; while it runs the daemon must not have taken `name` (if given).

    Returns how long the writer ran."""
    start = time.monotonic()
    while writer.poll() is None:
        taken = [j for j in job_rows(d) if Path(j["source_path"]).name == name]
        assert not taken, f"{name} was taken while it was still being written: {taken}"
        assert time.monotonic() - start < timeout, f"writer still running after {timeout} s"
        time.sleep(0.2)
    took = time.monotonic() - start
    out = writer.stdout.read().decode(errors="replace") if writer.stdout else ""
    assert writer.returncode == 0, f"writer failed ({writer.returncode}): {out}"
    return took


def need(*programs: str) -> None:
    missing = [p for p in programs if shutil.which(p) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (bash scripts/setup.sh --dev)")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float, proc: subprocess.Popen[bytes], log: Path) -> None:
    def listening() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"server exited ({proc.returncode}): {log.read_text()[-2000:]}")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.5)
            return s.connect_ex(("127.0.0.1", port)) == 0

    wait_for(listening, timeout, f"a server on 127.0.0.1:{port}")


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


# ---------------------------------------------------------------------------- rsync, cp


def test_rsync_with_bwlimit_large_and_small_files(
    tmp_path: Path, daemon_factory: DaemonFactory
) -> None:
    need("rsync")
    src = tmp_path / "src"
    src.mkdir()
    exp = Expected()
    exp.add(make_big_pdf(src / "big scan.pdf", ["Large rsync document", "walrus 9931"], 24 * MB),
            "walrus 9931")
    for i in range(3):
        exp.add(make_text_pdf(src / f"small-{i}.pdf", [[f"Small rsync file {i} heron"]]),
                f"file {i} heron")
    d = daemon_factory(stability_seconds=2).start()
    inbox = tmp_path / "inbox"
    seen_temp: set[str] = set()
    rsync = subprocess.Popen(
        ["rsync", "-rt", "--bwlimit=4000", *[str(p) for p in sorted(src.glob("small-*"))],
         str(src / "big scan.pdf"), f"{inbox}/"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    start = time.monotonic()
    while rsync.poll() is None:
        seen_temp.update(p.name for p in inbox.iterdir() if p.name.startswith("."))
        big = [j for j in job_rows(d) if Path(j["source_path"]).name == "big scan.pdf"]
        assert not big, "the big file was taken before rsync renamed it into place"
        time.sleep(0.1)
    took = time.monotonic() - start
    assert rsync.returncode == 0, rsync.stdout.read() if rsync.stdout else ""
    assert took > 4, f"rsync took only {took:.1f} s; the test wants a slow transfer"
    # rsync really wrote under `.big scan.pdf.XXXXXX` and renamed it
    assert any(n.startswith(".big scan.pdf.") for n in seen_temp), seen_temp
    assert_each_taken_once_and_whole(d, exp)
    print(f"rsync: 24 MiB + 3 small in {took:.1f} s; temp names seen: {sorted(seen_temp)}")
    assert d.stop() == 0


def test_cp_of_a_large_file_is_taken_once(tmp_path: Path, daemon_factory: DaemonFactory) -> None:
    src = tmp_path / "src"
    src.mkdir()
    exp = Expected()
    big = exp.add(make_big_pdf(src / "big.pdf", ["Copied with cp", "okapi 5150"], 48 * MB),
                  "okapi 5150")
    d = daemon_factory().start()
    wait_for(lambda: d.runtime().get("phase") == "idle", 120, "the worker", d.proc)
    cp = subprocess.Popen(["cp", str(big), str(tmp_path / "inbox" / "big.pdf")],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    took = wait_writer(d, cp, "big.pdf", 120)
    assert_each_taken_once_and_whole(d, exp)
    print(f"cp: 48 MiB in {took:.2f} s")
    assert d.stop() == 0


SLOW_WRITER = r"""
import random, sys, time
data = open(sys.argv[1], "rb").read()
random.seed(4)
pauses = [random.uniform(1.5, 2.5) for _ in range(11)]
step = -(-len(data) // (len(pauses) + 1))
with open(sys.argv[2], "wb") as f:
    for i in range(len(pauses) + 1):
        f.write(data[i * step:(i + 1) * step])
        f.flush()
        if i < len(pauses):
            time.sleep(pauses[i])
print(f"{time.time():.6f} longest pause {max(pauses):.2f}")
"""


def test_slow_appender_with_pauses_over_a_second_is_taken_once_after_it_ends(
    tmp_path: Path, daemon_factory: DaemonFactory
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    exp = Expected()
    pdf = exp.add(make_text_pdf(src / "slow.pdf", [[f"Slowly appended page {i} ibis"]
                                                   for i in range(4)]), "page 3 ibis")
    # Pauses of 1.5-2.5 s, 11 of them (~22 s in all); stability window above the longest.
    d = daemon_factory(stability_seconds=4).start()
    wait_for(lambda: d.runtime().get("phase") == "idle", 120, "the worker", d.proc)
    target = tmp_path / "inbox" / "slow.pdf"
    writer = subprocess.Popen([sys.executable, "-c", SLOW_WRITER, str(pdf), str(target)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    start = time.monotonic()
    while writer.poll() is None:
        assert not job_rows(d), "taken while the writer was pausing"
        time.sleep(0.2)
    took = time.monotonic() - start
    out = writer.stdout.read().decode() if writer.stdout else ""
    assert writer.returncode == 0, out
    finished = float(out.split()[0])
    assert took > 18, took
    assert_each_taken_once_and_whole(d, exp)
    job = job_rows(d)[0]
    assert job["created_at"] >= finished + 3.5, (job["created_at"] - finished)
    print(f"slow writer: {took:.1f} s, {out.strip()}; queued "
          f"{job['created_at'] - finished:.1f} s after its last write")
    assert d.stop() == 0


# ---------------------------------------------------------------------------- Samba


class ThrottledProxy:
    """A TCP proxy on 127.0.0.1 that limits client->server bytes to `rate` per second.

    smbclient has no rate limit of its own; a slow link (a scanner on Wi-Fi) is emulated
    here so a large upload takes seconds, as it does in the field.
    """

    def __init__(self, target_port: int, rate: float) -> None:
        self.target_port = target_port
        self.rate = rate
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = int(self.sock.getsockname()[1])
        self.closed = threading.Event()
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target_port))
            self.conns += [client, server]
            threading.Thread(target=self._pump, args=(client, server, self.rate),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, 0.0), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket, rate: float) -> None:
        chunk = 16 * 1024
        try:
            while data := a.recv(chunk):
                b.sendall(data)
                if rate:
                    time.sleep(len(data) / rate)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            b.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.closed.set()
        self.sock.close()
        for c in self.conns:
            with contextlib.suppress(OSError):
                c.close()


SMB_CONF = """[global]
  server role = standalone server
  interfaces = 127.0.0.1
  bind interfaces only = yes
  smb ports = {port}
  disable netbios = yes
  server min protocol = SMB2
  private dir = {d}/private
  lock directory = {d}/lock
  state directory = {d}/state
  cache directory = {d}/cache
  pid directory = {d}/run
  ncalrpc dir = {d}/run/ncalrpc
  log file = {d}/log/smbd.log
  passdb backend = tdbsam:{d}/private/passdb.tdb
  map to guest = Bad User
  guest account = root
  load printers = no
  printing = bsd
  printcap name = /dev/null
  disable spoolss = yes
[inbox]
  path = {share}
  read only = no
  guest ok = yes
  force user = root
"""


@pytest.fixture()
def samba(tmp_path: Path) -> Iterator[Callable[[Path], int]]:
    """Start smbd on 127.0.0.1 serving a folder as //127.0.0.1/inbox; returns its port."""
    need("smbd", "smbclient")
    if os.geteuid() != 0:
        pytest.skip("smbd needs root here (it switches to the guest/forced user)")
    procs: list[subprocess.Popen[bytes]] = []

    def start(share: Path) -> int:
        d = tmp_path / "samba"
        for sub in ("private", "lock", "state", "cache", "run", "log"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        port = free_port()
        conf = d / "smb.conf"
        conf.write_text(SMB_CONF.format(port=port, d=d, share=share))
        log = d / "smbd.out"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                ["smbd", "--foreground", "--no-process-group", "--debug-stdout", "-s",
                 str(conf)], stdout=out, stderr=subprocess.STDOUT,
                # its own process group: smbd signals its whole group when it exits
                start_new_session=True,
            )
        procs.append(proc)
        wait_port(port, 60, proc, log)
        return port

    yield start
    for p in procs:
        stop_process(p)


def smbclient(port: int, commands: str, cwd: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["smbclient", "-N", "-p", str(port), "//127.0.0.1/inbox", "-c", commands],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )


def watch_smb_put(d: DaemonProc, port: int, big: Path, inbox: Path) -> tuple[float, list[int]]:
    """smbclient `put` of `big`; returns (seconds, distinct sizes seen while it ran).

    Asserts the daemon does not take the file while smbd is still writing it."""
    put = smbclient(port, f'put "{big}" "{big.name}"', big.parent)
    sizes: list[int] = []
    start = time.monotonic()
    while put.poll() is None:
        with contextlib.suppress(FileNotFoundError):
            size = (inbox / big.name).stat().st_size
            if not sizes or sizes[-1] != size:
                sizes.append(size)
        taken = [j for j in job_rows(d) if Path(j["source_path"]).name == big.name]
        assert not taken, (
            f"taken while smbd was still writing it (sizes so far {sizes}, job size "
            f"{taken[0]['size']})"
        )
        time.sleep(0.1)
    assert put.returncode == 0, put.stdout.read() if put.stdout else ""
    return time.monotonic() - start, sizes


def test_samba_upload_of_a_large_file_and_several_at_once(
    tmp_path: Path, daemon_factory: DaemonFactory, samba: Callable[[Path], int]
) -> None:
    """smbd writes in place under the final name, in SMB2 WRITEs of up to 8 MiB: the file
    is created empty, then grows in 8 MiB steps, unchanged while each step crosses the
    link. With the default stability_seconds (5) and a 3 MB/s link (2.8 s per step) the
    tracker holds it until the upload ends."""
    src = tmp_path / "src"
    src.mkdir()
    exp = Expected()
    big = exp.add(make_big_pdf(src / "Scan 0001.pdf", ["Uploaded over SMB", "gecko 7207"],
                               24 * MB), "gecko 7207")
    many = src / "many"
    many.mkdir()
    for i in range(5):
        exp.add(make_big_pdf(many / f"batch-{i}.pdf", [f"SMB batch file {i} lemur"], MB),
                f"batch file {i} lemur")
    d = daemon_factory(stability_seconds=5).start()
    inbox = tmp_path / "inbox"
    proxy = ThrottledProxy(samba(inbox), rate=3 * MB)
    try:
        took, sizes = watch_smb_put(d, proxy.port, big, inbox)
        assert took > 5, f"the upload took only {took:.1f} s"
        partial = [s for s in sizes if 0 < s < big.stat().st_size]
        assert partial, f"expected to see the file grow in place: {sizes}"
        names = " ".join(f'"{p.name}"' for p in sorted(many.iterdir()))
        mput = smbclient(proxy.port, f"prompt off; mput {names}", many)
        mput_took = wait_writer(d, mput, None, 120)
    finally:
        proxy.close()
    assert_each_taken_once_and_whole(d, exp)
    assert not list(inbox.glob("*")), list(inbox.glob("*"))
    print(f"samba: 24 MiB put in {took:.1f} s, sizes seen {sizes}; "
          f"mput of 5 x 1 MiB in {mput_took:.1f} s")
    assert d.stop() == 0


def test_samba_upload_slower_per_write_than_the_window_is_still_held(
    tmp_path: Path, daemon_factory: DaemonFactory, samba: Callable[[Path], int]
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    exp = Expected()
    big = exp.add(make_big_pdf(src / "slow.pdf", ["Slow SMB link", "marmot 2718"], 16 * MB),
                  "marmot 2718")
    # 2 s window, 1.5 MB/s: each 8 MiB write keeps the file unchanged for ~5.6 s.
    d = daemon_factory(stability_seconds=2).start()
    inbox = tmp_path / "inbox"
    proxy = ThrottledProxy(samba(inbox), rate=1.5 * MB)
    try:
        watch_smb_put(d, proxy.port, big, inbox)
    finally:
        proxy.close()
    assert_each_taken_once_and_whole(d, exp)


# ---------------------------------------------------------------------------- FTP


VSFTPD_CONF = """listen=YES
listen_ipv6=NO
listen_address=127.0.0.1
listen_port={port}
background=NO
anonymous_enable=YES
no_anon_password=YES
anon_root={root}
write_enable=YES
anon_upload_enable=YES
anon_mkdir_write_enable=NO
anon_umask=022
local_enable=NO
pasv_enable=YES
pasv_address=127.0.0.1
pasv_min_port={pasv_min}
pasv_max_port={pasv_max}
port_enable=NO
secure_chroot_dir={empty}
seccomp_sandbox=NO
xferlog_enable=YES
vsftpd_log_file={log}
"""


def test_ftp_uploads_with_curl_limit_rate(tmp_path: Path, daemon_factory: DaemonFactory) -> None:
    """vsftpd (Debian's FTP server; scanners upload by FTP) writes in place, like smbd."""
    need("vsftpd", "curl")
    if os.geteuid() != 0:
        pytest.skip("vsftpd needs root to start (it drops privileges per session)")
    ftp_root = tmp_path / "ftproot"
    inbox = ftp_root / "inbox"
    inbox.mkdir(parents=True)
    os.chmod(ftp_root, 0o755)  # vsftpd refuses a chroot the anonymous user can write
    os.chmod(inbox, 0o777)  # ... but the upload folder must be writable by `ftp`
    (tmp_path / "vsftpd-empty").mkdir()
    port = free_port()
    pasv = free_port()
    conf = tmp_path / "vsftpd.conf"
    conf.write_text(VSFTPD_CONF.format(
        port=port, root=ftp_root, pasv_min=pasv, pasv_max=pasv, empty=tmp_path / "vsftpd-empty",
        log=tmp_path / "vsftpd.log"))
    log = tmp_path / "vsftpd.out"
    with open(log, "wb") as out:
        server = subprocess.Popen(["vsftpd", str(conf)], stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        wait_port(port, 30, server, log)
        src = tmp_path / "src"
        src.mkdir()
        exp = Expected()
        big = exp.add(make_big_pdf(src / "SCAN_0042.PDF", ["Scanner FTP upload", "tapir 3141"],
                                   2 * MB), "tapir 3141")
        smalls = [exp.add(make_text_pdf(src / f"page{i}.pdf", [[f"FTP small {i} quokka"]]),
                          f"small {i} quokka") for i in range(3)]
        d = daemon_factory(inboxes=[{"path": str(inbox)}], stability_seconds=2).start()
        url = f"ftp://127.0.0.1:{port}/inbox/"
        curl = subprocess.Popen(["curl", "-sS", "--limit-rate", "200k", "-T", str(big), url],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        sizes: list[int] = []
        start = time.monotonic()
        while curl.poll() is None:
            with contextlib.suppress(FileNotFoundError):
                sizes.append((inbox / big.name).stat().st_size)
            assert not job_rows(d), "taken while the FTP upload was running"
            time.sleep(0.2)
        took = time.monotonic() - start
        assert curl.returncode == 0, curl.stdout.read() if curl.stdout else ""
        assert took > 8, took
        assert len({s for s in sizes if 0 < s < big.stat().st_size}) >= 5, sizes[:20]
        several = "{" + ",".join(str(p) for p in smalls) + "}"
        curl2 = subprocess.Popen(["curl", "-sS", "--limit-rate", "200k", "-T", several, url],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        wait_writer(d, curl2, None, 60)
        assert_each_taken_once_and_whole(d, exp)
        print(f"ftp: 2 MiB at 200 KiB/s in {took:.1f} s, then 3 small in one curl")
        assert d.stop() == 0
    finally:
        stop_process(server)


# ---------------------------------------------------------------------------- FUSE


@pytest.fixture()
def bindfs_mount(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A bindfs FUSE mount of `nas/` at `mnt/`; writes to nas/ give no events on mnt/."""
    need("bindfs")
    if not os.path.exists("/dev/fuse"):
        pytest.skip("no /dev/fuse on this machine (containers need --device /dev/fuse)")
    source, mnt = tmp_path / "nas", tmp_path / "mnt"
    source.mkdir()
    mnt.mkdir()
    r = subprocess.run(["bindfs", str(source), str(mnt)], capture_output=True, text=True,
                       check=False)
    if r.returncode != 0:
        pytest.skip(f"cannot mount bindfs here: {r.stderr.strip() or r.returncode}")
    try:
        yield source, mnt
    finally:
        for cmd in (["fusermount3", "-u", str(mnt)], ["fusermount", "-u", str(mnt)],
                    ["umount", "-l", str(mnt)]):
            if shutil.which(cmd[0]) and subprocess.run(cmd, capture_output=True,
                                                       check=False).returncode == 0:
                break


def put_atomically(src: Path, folder: Path) -> None:
    tmp = folder / f".{src.name}.part"
    shutil.copyfile(src, tmp)
    os.rename(tmp, folder / src.name)


def test_fuse_inbox_without_events_is_polled_automatically(
    tmp_path: Path, daemon_factory: DaemonFactory, bindfs_mount: tuple[Path, Path]
) -> None:
    source, mnt = bindfs_mount
    fstype = next(line.split(" - ")[1].split()[0] for line in
                  Path("/proc/self/mountinfo").read_text().splitlines()
                  if line.split()[4] == str(mnt))
    src = tmp_path / "src"
    src.mkdir()
    exp = Expected()
    # rescan_seconds far away: only the polling observer can find these in time.
    d = daemon_factory(inboxes=[{"path": str(mnt)}], rescan_seconds=3600).start()
    inbox_facts = wait_for(lambda: d.runtime().get("inboxes"), 60, "status facts", d.proc)
    assert inbox_facts[0]["observer"] == "poll", inbox_facts
    assert "network/FUSE" in inbox_facts[0]["reason"], inbox_facts
    assert "watching with poll" in d.output()
    wait_for(lambda: d.runtime().get("phase") == "idle", 120, "the worker", d.proc)
    for i in range(3):
        pdf = exp.add(make_text_pdf(src / f"nas-{i}.pdf", [[f"Written behind FUSE {i} bison"]]),
                      f"FUSE {i} bison")
        put_atomically(pdf, source)  # into the SOURCE folder: no event on the mount
    t0 = time.monotonic()
    d.wait_settled(3, timeout=240)
    found = time.monotonic() - t0
    # No rescan comes: the poller looking again after the three were taken is shown by a
    # file of no document type put behind the mount after them, and listed as left alone.
    (source / "look-again.txt").write_text("not a document\n")
    assert_each_taken_once_and_whole(d, exp, noticed="look-again.txt")
    print(f"fuse ({fstype}): 3 files written to the source found by polling in {found:.1f} s")
    assert d.stop() == 0


def test_fuse_inbox_with_forced_events_misses_writes_to_the_source(
    tmp_path: Path, daemon_factory: DaemonFactory, bindfs_mount: tuple[Path, Path]
) -> None:
    """The reason for the automatic choice: inotify on the mount sees nothing."""
    source, mnt = bindfs_mount
    d = daemon_factory(inboxes=[{"path": str(mnt), "watch": "events"}],
                       rescan_seconds=3600).start()
    wait_for(lambda: d.runtime().get("phase") == "idle", 120, "the worker", d.proc)
    facts = d.runtime()["inboxes"][0]
    assert facts["observer"] == "events", facts
    since = time.time()
    put_atomically(make_text_pdf(tmp_path / "unseen.pdf", [["never seen"]]), source)
    # Right after it, a file put THROUGH the mount, which inotify does see: an event for
    # unseen.pdf would have been queued before this one's, so once this one is listed as
    # left alone (no document type) and nothing is pending, unseen.pdf would be taken.
    (mnt / "look-again.txt").write_text("not a document\n")
    wait_looked_at_again(d, since, noticed="look-again.txt")
    assert job_rows(d) == [], "inotify saw a write made behind the FUSE mount"
    assert (mnt / "unseen.pdf").exists()  # visible through the mount, yet no event
    assert d.stop() == 0
