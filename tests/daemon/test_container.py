"""The container image: the root Dockerfile built unchanged with Podman, then run as a NAS
runs it: bind-mounted folders, a non-root PUID/PGID, tini, the healthcheck, `podman stop`,
`podman kill -s KILL`, a read-only root, a FUSE share, and compose.yaml under podman-compose.

No container registry is reachable where this runs, so the `debian:bookworm-slim` the
Dockerfile starts FROM is made here when Podman does not have it: `mmdebstrap
--variant=minbase bookworm` (the same Debian release, a few MB larger than the official
image) imported under that name. pip inside the build uses the package sources this
machine's pip is configured with (index, extra indexes, wheel folders, CA bundle), passed as
build arguments, local folders mounted read-only into the build; with none configured the
Dockerfile's defaults (PyPI, PyTorch's CPU wheel index) apply.

Cached between runs on one machine, never required: the rootfs tarball and pip's download
cache under ~/.cache/docinbox-test ($DOCINBOX_TEST_CACHE). The image is built once per
session; Podman's layer cache makes a rebuild after a code change take seconds.

The tests skip, with the reason, where Podman cannot run (not installed, not root); under
CI (CI=true) that is a failure instead, since CI's machine is set up to run them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml

from tests import docgen
from tests.conftest import REPO, DaemonProc, drop, wait_for

CACHE = Path(os.environ.get("DOCINBOX_TEST_CACHE", Path.home() / ".cache" / "docinbox-test"))
BASE_IMAGE = "docker.io/library/debian:bookworm-slim"
IMAGE = "localhost/docinbox-test:latest"
# The base rootfs is rebuilt after this long, so that the image gets Debian's updates.
BASE_MAX_AGE_SECONDS = 7 * 86400
PUID, PGID = 1234, 2345
DATA = ("inbox", "outbox", "archive", "failed", "duplicates")
# The build reads the package indexes from here when the host's pip names a CA bundle.
BUILD_CERT = "/mnt/pip-cert/ca-bundle.pem"


def unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"container tests must run in CI: {reason}")
    pytest.skip(reason)


@dataclass(frozen=True)
class Podman:
    """The podman command with this session's containers.conf."""

    env: dict[str, str]

    def __call__(
        self, *args: str, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(["podman", *args], env=self.env, capture_output=True, text=True,
                           timeout=timeout, check=False)
        if check and r.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)} -> {r.returncode}:\n{r.stderr[-3000:]}")
        return r

    def logs(self, name: str) -> str:
        r = self("logs", name, check=False)
        return r.stdout + r.stderr

    def state(self, name: str) -> dict[str, Any]:
        info: list[dict[str, Any]] = json.loads(self("inspect", name).stdout)
        state: dict[str, Any] = info[0]["State"]
        return state


@pytest.fixture(scope="session")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Podman:
    if shutil.which("podman") is None:
        unavailable("podman is not installed (bash scripts/setup.sh --dev installs it)")
    if os.geteuid() != 0:
        unavailable("the container tests run rootful Podman: run them as root")
    conf = tmp_path_factory.mktemp("podman") / "containers.conf"
    # No default ulimits: raising NOFILE/NPROC is refused inside some sandboxes (this one).
    # runc: crun fails on hybrid cgroup hierarchies; setup.sh --dev installs runc.
    runtime = '[engine]\nruntime = "runc"\n' if shutil.which("runc") else ""
    conf.write_text(f"[containers]\ndefault_ulimits = []\n{runtime}")
    tool = Podman({**os.environ, "CONTAINERS_CONF": str(conf)})
    r = tool("info", check=False)
    if r.returncode != 0:
        unavailable(f"podman cannot run here: {r.stderr.strip()[-500:]}")
    return tool


def ensure_base_image(podman: Podman) -> None:
    """`debian:bookworm-slim` in Podman's storage: as it is, or made with mmdebstrap."""
    if podman("image", "exists", BASE_IMAGE, check=False).returncode == 0:
        return
    tarball = CACHE / "bookworm-minbase.tar"
    if not tarball.exists() or time.time() - tarball.stat().st_mtime > BASE_MAX_AGE_SECONDS:
        if shutil.which("mmdebstrap") is None:
            unavailable("no debian:bookworm-slim image and no mmdebstrap to make one "
                        "(bash scripts/setup.sh --dev installs it)")
        CACHE.mkdir(parents=True, exist_ok=True)
        partial = CACHE / f"partial-{os.getpid()}.tar"
        r = subprocess.run(["mmdebstrap", "--variant=minbase", "bookworm", str(partial)],
                           capture_output=True, text=True, timeout=1200, check=False)
        if r.returncode != 0:
            partial.unlink(missing_ok=True)
            pytest.fail(f"mmdebstrap failed:\n{r.stderr[-3000:]}")
        os.replace(partial, tarball)
    podman("import", str(tarball), BASE_IMAGE, timeout=600)


def host_pip_settings() -> dict[str, str]:
    """What this machine's pip is configured with (`pip config list`; environment wins)."""
    r = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                       text=True, timeout=120, check=False)
    found: dict[str, str] = {}
    from_env: dict[str, str] = {}
    for line in r.stdout.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        name = key.rsplit(".", 1)[-1]
        target = from_env if key.startswith(":env:") else found
        target[name] = value.strip().strip("'\"")
    return {**found, **from_env}


def local_folder(source: str, *, index: bool) -> Path | None:
    """The folder to mount for a pip source that is a local path or file:// URL.

    A "simple" index's pages link to files beside it (../../files/x.whl), so the folder
    above `simple` is mounted.
    """
    path = source.removeprefix("file://") if source.startswith("file://") else source
    if not path.startswith("/"):
        return None
    folder = Path(path)
    if index and folder.name == "simple":
        folder = folder.parent
    return folder if folder.exists() else None


def build_options() -> list[str]:
    """--build-arg and -v options that give the build this machine's pip sources."""
    settings = host_pip_settings()
    options: list[str] = []
    mounts: set[Path] = set()
    for key, arg, index in (("index-url", "INDEX_URL", True),
                            ("extra-index-url", "EXTRA_INDEX_URL", True),
                            ("find-links", "FIND_LINKS", False)):
        value = settings.get(key, "").strip()
        if not value:
            continue
        options += ["--build-arg", f"{arg}={value}"]
        for source in value.split():
            folder = local_folder(source, index=index)
            if folder is not None:
                mounts.add(folder)
    for folder in sorted(mounts):
        options += ["-v", f"{folder}:{folder}:ro"]
    cert = settings.get("cert") or os.environ.get("PIP_CERT")
    if cert and Path(cert).is_file():
        # Not at its own path: /etc/ssl/certs is where the build's ca-certificates writes.
        options += ["--build-arg", f"CERT={BUILD_CERT}", "-v", f"{cert}:{BUILD_CERT}:ro"]
    if "TORCH_INDEX_URL" in os.environ:
        options += ["--build-arg", f"TORCH_INDEX_URL={os.environ['TORCH_INDEX_URL']}"]
    elif mounts or "index-url" in settings:
        # Like scripts/setup.sh here: torch from the sources configured above (a CPU
        # wheel among them; the Dockerfile refuses a CUDA build).
        options += ["--build-arg", "TORCH_INDEX_URL="]
    return options


def drop_stale_stages(podman: Podman, build_output: str) -> None:
    """Remove this Dockerfile's untagged stage images that the build just made did not use.

    Each build keeps its stages' images (the venv of the deps stage is 2 GB) as the next
    build's cache; after a dependency change the old ones are cache for nothing, and on a
    CI machine that runs this for every change they would fill the disk.
    """
    used = set(re.findall(r"\b[0-9a-f]{11,64}\b", build_output))
    listed = podman("images", "--quiet", "--no-trunc", "--filter", "dangling=true",
                    "--filter", "label=org.opencontainers.image.title=docinbox").stdout
    stale = [i for i in listed.split()
             if not any(i.removeprefix("sha256:").startswith(u) for u in used)]
    if stale:
        podman("rmi", *stale, check=False)


def image_id(podman: Podman) -> str:
    return podman("image", "inspect", "--format", "{{.Id}}", IMAGE, check=False).stdout.strip()


@pytest.fixture(scope="session")
def image(podman: Podman) -> str:
    ensure_base_image(podman)
    pip_cache = CACHE / "pip"
    pip_cache.mkdir(parents=True, exist_ok=True)
    previous = image_id(podman)
    r = podman("build", "--network=host", "--format", "docker", *build_options(),
               "-v", f"{pip_cache}:/root/.cache/pip", "-t", IMAGE, str(REPO),
               check=False, timeout=1800)
    if r.returncode != 0:
        pytest.fail(f"podman build failed:\n{(r.stdout + r.stderr)[-5000:]}")
    if previous and previous != image_id(podman):
        podman("rmi", previous, check=False)
    drop_stale_stages(podman, r.stdout + r.stderr)
    size = json.loads(podman("image", "inspect", IMAGE).stdout)[0]["Size"]
    print(f"\nimage {IMAGE}: {size / 1e9:.2f} GB uncompressed")
    return IMAGE


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(frozen=True)
class Site:
    """A NAS as the container sees it: share folders and a config folder on the host."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config"

    def data(self, name: str) -> Path:
        return self.root / "data" / name

    @property
    def state(self) -> DaemonProc:
        """A reader of the job database in config/state (no process is started)."""
        return DaemonProc(self.config, self.config / "config.yaml")

    def settled_jobs(self, n: int) -> list[dict[str, Any]] | None:
        """The jobs once `n` of them have finished, else None."""
        return self.state.jobs() if self.state.settled(n) else None

    def mounts(self, *, skip: tuple[str, ...] = ()) -> list[str]:
        opts = ["-v", f"{self.config}:/config"]
        for name in DATA:
            if name not in skip:
                opts += ["-v", f"{self.data(name)}:/data/{name}"]
        return opts

    def owned_files(self) -> list[Path]:
        """Everything the daemon wrote: output folders' contents and the job database."""
        found = [p for name in DATA[1:] for p in self.data(name).rglob("*")]
        return found + list((self.config / "state").rglob("*"))


def make_site(root: Path, uid: int = PUID, gid: int = PGID, **overrides: Any) -> Site:
    """Share folders owned by uid:gid (as on a NAS), and the image's own default config
    with fast test timings and the lite engine."""
    site = Site(root)
    for name in DATA:
        site.data(name).mkdir(parents=True)
        os.chown(site.data(name), uid, gid)
    site.config.mkdir()  # root's, as a fresh host folder is: the entrypoint hands it over
    cfg = yaml.safe_load((REPO / "container" / "config.yaml").read_text())
    cfg.update(stability_seconds=1, rescan_seconds=2)
    cfg["engine"] = {"name": "lite", "fallback_engine": None, "dpi": 100}
    cfg["worker"] = {**cfg["worker"], "heartbeat_seconds": 1}
    cfg.update(overrides)
    (site.config / "config.yaml").write_text(yaml.safe_dump(cfg))
    return site


@pytest.fixture()
def run(podman: Podman, image: str) -> Iterator[Any]:
    """`run(site, *podman_run_options, args=...)` starts a detached container and returns
    its name; every container started is removed (with its anonymous volumes) at the end."""
    names: list[str] = []

    def start(site: Site, *options: str, args: tuple[str, ...] = (),
              skip: tuple[str, ...] = ()) -> str:
        name = f"docinbox-test-{uuid.uuid4().hex[:10]}"
        names.append(name)
        podman("run", "-d", "--name", name, "--health-interval=disable",
               "-e", f"PUID={PUID}", "-e", f"PGID={PGID}", *site.mounts(skip=skip),
               *options, image, *args)
        return name

    yield start
    for name in names:
        podman("rm", "-f", "-v", "--time", "0", name, check=False)


def wait_exited(podman: Podman, name: str, timeout: float) -> dict[str, Any]:
    return wait_for(lambda: (s := podman.state(name))["Status"] == "exited" and s, timeout,
                    f"container {name} to exit")


# -- tests ------------------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.container
def test_scan_duplicate_and_broken_file_owned_by_puid_on_a_read_only_root(
    tmp_path: Path, podman: Podman, run: Any
) -> None:
    site = make_site(tmp_path / "nas")
    name = run(site, "--read-only", "--tmpfs", "/tmp")
    scan = docgen.make_text_image(tmp_path / "scan.png", ["Container invoice 4711",
                                                          "Total due 99 EUR"])
    inbox = site.data("inbox")
    drop(scan, inbox)
    jobs = wait_for(lambda: site.settled_jobs(1), 180,
                    "the scan to be converted")
    assert [j["state"] for j in jobs] == ["done"], podman.logs(name)[-3000:]
    drop(scan, inbox, "scan-again.png")
    broken = tmp_path / "broken.pdf"
    broken.write_bytes(b"%PDF-1.7\n" + os.urandom(4096))
    drop(broken, inbox)
    # Built without OFFICE=1: a Word file fails with the message that names LibreOffice.
    drop(docgen.make_docx(tmp_path / "letter.docx", ["Dear NAS owner"]), inbox)
    wait_for(lambda: site.state.settled(4), 180, "the duplicate, broken and Word files")

    assert site.state.states() == {"scan.png": "done", "scan-again.png": "duplicate",
                                   "broken.pdf": "failed", "letter.docx": "failed"}
    md = site.data("outbox") / "scan" / "scan.md"
    assert "4711" in md.read_text(), md.read_text()
    assert (site.data("archive") / "scan.png").exists()
    assert (site.data("duplicates") / "scan-again.png").exists()
    assert (site.data("failed") / "broken.pdf").exists()
    error = json.loads((site.data("failed") / "broken.pdf.error.json").read_text())
    assert error["reason"], error
    office = json.loads((site.data("failed") / "letter.docx.error.json").read_text())
    assert "LibreOffice, which is not installed" in office["reason"], office
    assert sorted(p.name for p in inbox.iterdir()) == []

    written = site.owned_files()
    assert len(written) > 6, written
    wrong = [(str(p), p.lstat().st_uid, p.lstat().st_gid) for p in written
             if (p.lstat().st_uid, p.lstat().st_gid) != (PUID, PGID)]
    assert wrong == [], f"not owned by PUID/PGID {PUID}:{PGID}: {wrong}"

    assert podman("healthcheck", "run", name, check=False).returncode == 0, podman.logs(name)

    # The stop allows 120 s; exit code 0 means the daemon stopped itself before the
    # runtime's SIGKILL (which would make it 137).
    podman("stop", "--time", "120", name, timeout=180)
    state = podman.state(name)
    logs = podman.logs(name)
    assert state["ExitCode"] == 0, logs[-3000:]
    assert "stopped cleanly" in logs


@pytest.mark.integration
@pytest.mark.container
def test_kill_mid_document_then_start_again_completes_it_once(
    tmp_path: Path, podman: Podman, run: Any
) -> None:
    site = make_site(tmp_path / "nas", engine={"name": "lite", "fallback_engine": None,
                                               "dpi": 200})
    # Body text (a page of two short lines reads as a header, which Markdown leaves out).
    pages = [[f"Page {i} of the long container scan",
              "The quarterly report lists every delivery of the month",
              f"with its serial number {1000 + i} and the warehouse it left from.",
              "Each line of this page is plain body text for the OCR to read",
              "so that the page lands in the Markdown output in full."]
             for i in range(1, 13)]
    long_pdf = docgen.make_scanned_pdf(tmp_path / "long.pdf", pages)
    name = run(site)
    drop(long_pdf, site.data("inbox"))
    wait_for(lambda: site.state.states().get("long.pdf") == "running", 180,
             "the document to start", None)
    podman("kill", "--signal", "KILL", name)
    assert wait_exited(podman, name, 60)["ExitCode"] != 0
    assert site.state.states() == {"long.pdf": "running"}, (
        "the document was no longer running when the kill landed: the test proved nothing")

    podman("start", name)
    jobs = wait_for(lambda: site.settled_jobs(1), 600,
                    "the document to complete after the restart")
    logs = podman.logs(name)
    assert [(j["source_path"].rsplit("/", 1)[-1], j["state"]) for j in jobs] == [
        ("long.pdf", "done")], logs[-3000:]
    outputs = sorted(p.relative_to(site.data("outbox"))
                     for p in site.data("outbox").rglob("*.md"))
    assert outputs == [Path("long/long.md")]
    text = (site.data("outbox") / "long" / "long.md").read_text()
    assert "1001" in text and "1012" in text, text[-2000:]
    assert (site.data("archive") / "long.pdf").exists()
    assert list(site.data("failed").iterdir()) == []


@pytest.mark.integration
@pytest.mark.container
def test_missing_inbox_is_refused_not_created(
    tmp_path: Path, podman: Podman, run: Any
) -> None:
    site = make_site(tmp_path / "nas")
    name = run(site, skip=("inbox",))  # the share is not mounted
    state = wait_exited(podman, name, 120)
    logs = podman.logs(name)
    assert state["ExitCode"] == 78, logs
    assert "inbox /data/inbox does not exist" in logs
    assert "is the share mounted?" in logs


@pytest.fixture()
def fuse_share(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A bindfs FUSE mount of `nas-disk/` at `share/`, as a NAS's network mount stands in
    for the disk behind it: writes to nas-disk/ give no inotify event on share/."""
    if shutil.which("bindfs") is None:
        unavailable("bindfs is not installed (bash scripts/setup.sh --dev installs it)")
    if not os.path.exists("/dev/fuse"):
        unavailable("no /dev/fuse on this machine")
    disk, share = tmp_path / "nas-disk", tmp_path / "share"
    disk.mkdir()
    share.mkdir()
    os.chown(disk, PUID, PGID)
    # allow_other: the container's PUID, not only root who mounts it, reads the share.
    r = subprocess.run(["bindfs", "-o", "allow_other", str(disk), str(share)],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        unavailable(f"cannot mount bindfs here: {r.stderr.strip() or r.returncode}")
    try:
        yield disk, share
    finally:
        for cmd in (["fusermount3", "-u", str(share)], ["umount", "-l", str(share)]):
            if shutil.which(cmd[0]) and subprocess.run(cmd, capture_output=True,
                                                       check=False).returncode == 0:
                break


@pytest.mark.integration
@pytest.mark.container
def test_fuse_share_mounted_into_the_container_is_polled(
    tmp_path: Path, podman: Podman, run: Any, fuse_share: tuple[Path, Path]
) -> None:
    disk, share = fuse_share
    site = make_site(tmp_path / "nas")
    name = run(site, "-v", f"{share}:/data/inbox", skip=("inbox",))
    # mountinfo inside the container shows the bind mount with the share's file system.
    wait_for(lambda: "inbox /data/inbox: watching with poll (fuse at /data/inbox"
             in podman.logs(name), 120, "the daemon to pick polling for the FUSE inbox")
    scan = docgen.make_text_image(tmp_path / "behind.png", ["Written behind the share 5150"])
    drop(scan, disk)  # no event reaches the mount: only polling sees it
    wait_for(lambda: site.state.settled(1), 180, "the file written behind the share")
    assert site.state.states() == {"behind.png": "done"}, podman.logs(name)[-3000:]
    assert "5150" in (site.data("outbox") / "behind" / "behind.md").read_text()


def compose_command() -> list[str]:
    beside = Path(sys.executable).parent / "podman-compose"
    found = str(beside) if beside.exists() else shutil.which("podman-compose")
    if found is None:
        unavailable("podman-compose is not installed (bash scripts/setup.sh --dev installs it)")
    return [found]


def healthz(port: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
            body: dict[str, Any] = json.loads(resp.read())
            return body if resp.status == 200 else None
    except (OSError, urllib.error.URLError, ValueError):
        return None


@pytest.mark.integration
@pytest.mark.container
def test_compose_file_starts_the_service_and_serves_healthz(
    tmp_path: Path, podman: Podman, image: str
) -> None:
    compose = compose_command()
    spec = yaml.safe_load((REPO / "compose.yaml").read_text())
    service = spec["services"]["docinbox"]
    # The shipped file as it is, but the image built by this session (no second build)
    # and a free host port instead of 8731, on loopback as shipped.
    assert service["ports"] == ["127.0.0.1:8731:8731"]
    port = free_port()
    del service["build"]
    service["image"] = image
    service["ports"] = [f"127.0.0.1:{port}:8731"]
    project = tmp_path / "compose"
    project.mkdir()
    (project / "compose.yaml").write_text(yaml.safe_dump(spec))
    uid, gid = int(service["environment"]["PUID"]), int(service["environment"]["PGID"])
    for volume in service["volumes"]:
        host = volume.split(":", 1)[0]
        if host.startswith("./data/"):
            (project / host).mkdir(parents=True)
            os.chown(project / host, uid, gid)
    (project / "config").mkdir()
    name = f"docinboxtest{uuid.uuid4().hex[:8]}"

    def compose_run(*args: str, timeout: float = 300) -> str:
        r = subprocess.run([*compose, "-p", name, *args], cwd=project, env=podman.env,
                           capture_output=True, text=True, timeout=timeout, check=False)
        assert r.returncode == 0, f"podman-compose {args} -> {r.returncode}:\n{r.stderr[-3000:]}"
        return r.stdout

    def container() -> str:
        out = podman("ps", "-a", "--filter", f"label=io.podman.compose.project={name}",
                     "--format", "{{.Names}}").stdout.split()
        assert len(out) == 1, out
        return out[0]

    try:
        compose_run("up", "-d")
        body = wait_for(lambda: healthz(port), 180, "/healthz through the published port")
        assert body["status"] in ("ok", "degraded"), body
        shipped = (REPO / "container" / "config.yaml").read_text()
        config = project / "config" / "config.yaml"
        assert config.read_text() == shipped
        token = project / "config" / "http-token"
        assert token.stat().st_mode & 0o777 == 0o600 and token.stat().st_uid == uid
        # The status page itself asks for that token.
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/status.json", timeout=5)
        assert refused.value.code == 401
        bearer = {"Authorization": f"Bearer {token.read_text().strip()}"}
        for path in ("/status.json", "/"):  # "/": the templates are in the installed package
            request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=bearer)
            with urllib.request.urlopen(request, timeout=5) as resp:
                assert resp.status == 200, path

        compose_run("stop", timeout=1200)
        assert podman.state(container())["ExitCode"] == 0, podman.logs(container())[-3000:]
        # An edited config survives the next start.
        config.write_text(shipped + "# edited on the NAS\n")
        compose_run("up", "-d")
        wait_for(lambda: healthz(port), 180, "/healthz after the restart")
        assert config.read_text().endswith("# edited on the NAS\n")
    finally:
        with contextlib.suppress(Exception):
            compose_run("down", "-v", "-t", "30")


def test_compose_grace_period_covers_the_shutdown_timeout() -> None:
    """compose.yaml's stop_grace_period is worker.shutdown_timeout_seconds of the shipped
    container config plus a margin, and its healthcheck asks the configured port."""
    service = yaml.safe_load((REPO / "compose.yaml").read_text())["services"]["docinbox"]
    cfg = yaml.safe_load((REPO / "container" / "config.yaml").read_text())
    grace = service["stop_grace_period"]
    assert grace.endswith("s")
    assert int(grace[:-1]) > cfg["worker"]["shutdown_timeout_seconds"]
    port = cfg["http"]["port"]
    assert f":{port}/healthz" in " ".join(service["healthcheck"]["test"])
    assert f":{port}/healthz" in (REPO / "Dockerfile").read_text()
    assert service["ports"] == [f"127.0.0.1:{port}:{port}"]
