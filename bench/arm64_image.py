"""The arm64 image, built and run under emulation on an x86 host: its size, and the time
it takes to convert a real scan with the `lite` engine inside it.

    . .venv/bin/activate
    python bench/arm64_image.py [--scan bench/realscans/images/dta-bebel-frau-1879-0146.png]
                                [--mineru] [--skip-build] [--out results.json]

Not CI: under qemu the build takes tens of minutes and one page several. Run as root
(rootful Podman), with Debian's qemu-user-static, binfmt-support, mmdebstrap and arch-test.

1. binfmt: qemu-aarch64 registered with the kernel (the binfmt_misc file system mounted and
   `update-binfmts --enable qemu-aarch64` when it is not).
2. The base: `mmdebstrap --variant=minbase --architectures=arm64 bookworm` imported into
   Podman as BASE_IMAGE (no registry is needed; debian:bookworm-slim's name stays with the
   amd64 image).
3. The image: the root Dockerfile, `podman build --platform linux/arm64` with
   BASE_IMAGE and TORCH_SPEC (PyPI's aarch64 torch at the pyproject pin is a CUDA build).
4. One page: `docinbox parse --engine lite` on the scan inside the image, timed from the
   command's start (worker start and model load included) and by the page's own seconds.
   The Markdown's share of the ground truth's words says the OCR read the page.
5. --mineru: the `mineru` engine on the tiny Qwen2-VL of tests/tinymodel.py: it imports,
   loads and converts a page on arm64 (correctness only; no speed under emulation).

Why /proc/cpuinfo is mounted: qemu-user 7.2 (Debian bookworm) hands the guest the host's
x86 /proc/cpuinfo. The cpuinfo library inside onnxruntime (and torch) parses it for the
ARM cores' MIDR fields, finds none, and onnxruntime dereferences a NULL pointer while its
module loads: `import onnxruntime` dies with SIGSEGV, and with it every `lite` worker. A
file shaped like an arm64 kernel's, one entry per host CPU, stands in for it; real arm64
hardware (and Docker Desktop's arm64 VM) has its own.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("DOCINBOX_BENCH_CACHE",
                            Path.home() / ".cache" / "docinbox-bench")) / "arm64"
BASE_IMAGE = "localhost/docinbox-base-arm64:bookworm"
IMAGE = "localhost/docinbox-arm64:latest"
# PyPI's aarch64 torch at the pyproject pin (2.13.0) is a CUDA build; 2.9.1 is a CPU one.
TORCH_SPEC = "torch==2.9.1"
SCAN = REPO / "bench" / "realscans" / "images" / "dta-bebel-frau-1879-0146.png"
BINFMT = Path("/proc/sys/fs/binfmt_misc")
# An arm64 kernel's entry for a Neoverse-N1 core (MIDR 0x413fd0c1), repeated per CPU.
CPUINFO_ENTRY = """processor\t: {n}
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm \
lrcpc dcpop asimddp
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x3
CPU part\t: 0xd0c
CPU revision\t: 1

"""


@dataclass(frozen=True)
class Podman:
    """podman with a containers.conf for this sandbox: no default ulimits (raising them is
    refused here) and runc (crun fails on hybrid cgroup hierarchies)."""

    env: dict[str, str]

    def __call__(self, *args: str, timeout: float = 600,
                 check: bool = True) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(["podman", "--runtime", "runc", *args], env=self.env,
                           capture_output=True, text=True, timeout=timeout, check=False)
        if check and r.returncode != 0:
            sys.exit(f"podman {' '.join(args[:3])} ... -> {r.returncode}:\n"
                     f"{(r.stdout + r.stderr)[-4000:]}")
        return r


def make_podman(folder: Path) -> Podman:
    conf = folder / "containers.conf"
    conf.write_text('[containers]\ndefault_ulimits = []\n[engine]\nruntime = "runc"\n')
    return Podman({**os.environ, "CONTAINERS_CONF": str(conf)})


def run(*cmd: str, timeout: float = 600) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} -> {r.returncode}:\n{(r.stdout + r.stderr)[-4000:]}")
    return r.stdout


def ensure_binfmt() -> None:
    entry = BINFMT / "qemu-aarch64"
    if not (BINFMT / "status").exists():
        run("mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT))
    if not entry.exists() or "enabled" not in entry.read_text():
        run("update-binfmts", "--enable", "qemu-aarch64")
    text = entry.read_text()
    # F: the interpreter is opened at registration, so it works inside a container's root.
    if "enabled" not in text or not re.search(r"^flags: .*F", text, re.M):
        sys.exit(f"qemu-aarch64 is not usable from containers:\n{text}")


def ensure_base(podman: Podman) -> None:
    if podman("image", "exists", BASE_IMAGE, check=False).returncode == 0:
        return
    tarball = CACHE / "bookworm-minbase-arm64.tar"
    if not tarball.exists():
        partial = CACHE / f"partial-{os.getpid()}.tar"
        log = run("mmdebstrap", "--variant=minbase", "--architectures=arm64", "bookworm",
                  str(partial), timeout=3600)
        (CACHE / "mmdebstrap.log").write_text(log)
        os.replace(partial, tarball)
    podman("import", "--os", "linux", "--arch", "arm64", str(tarball), BASE_IMAGE)


def pip_cert() -> Path | None:
    """The CA bundle this machine's pip uses (a TLS-inspecting proxy's CA may be in it)."""
    r = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.cert"],
                       capture_output=True, text=True, check=False)
    cert = os.environ.get("PIP_CERT") or r.stdout.strip()
    return Path(cert) if cert and Path(cert).is_file() else None


def build(podman: Podman) -> float:
    """The arm64 image from the root Dockerfile, pip reading PyPI alone: the local wheel
    folders and indexes a test machine may have are x86-only."""
    pip_cache = CACHE / "pip"
    pip_cache.mkdir(parents=True, exist_ok=True)
    options = ["--build-arg", f"BASE_IMAGE={BASE_IMAGE}",
               "--build-arg", f"TORCH_SPEC={TORCH_SPEC}",
               "--build-arg", "TORCH_INDEX_URL=",
               "-v", f"{pip_cache}:/root/.cache/pip"]
    cert = pip_cert()
    if cert is not None:
        options += ["--build-arg", "CERT=/mnt/pip-cert/ca-bundle.pem",
                    "-v", f"{cert}:/mnt/pip-cert/ca-bundle.pem:ro"]
    start = time.monotonic()
    podman("build", "--platform", "linux/arm64", "--network=host", "--format", "docker",
           *options, "-t", IMAGE, str(REPO), timeout=4 * 3600)
    return time.monotonic() - start


def image_facts(podman: Podman) -> dict[str, Any]:
    info = json.loads(podman("image", "inspect", IMAGE).stdout)[0]
    versions = podman(
        "run", "--rm", "--platform", "linux/arm64", "--entrypoint=", IMAGE, "python3", "-c",
        "import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p in "
        "('torch', 'onnxruntime', 'opencv-python-headless', 'rapidocr', 'transformers')}))",
        timeout=900).stdout
    return {"size_bytes": info["Size"], "architecture": info["Architecture"],
            "packages": json.loads(versions.strip().splitlines()[-1])}


def cpuinfo_file(folder: Path) -> Path:
    path = folder / "cpuinfo"
    path.write_text("".join(CPUINFO_ENTRY.format(n=n) for n in range(os.cpu_count() or 1)))
    return path


def parse_in_image(podman: Podman, work: Path, engine: dict[str, Any], scan: Path,
                   extra: Sequence[str] = ()) -> tuple[float, subprocess.CompletedProcess[str]]:
    """`docinbox parse` inside the image on `scan`, with `engine` as the configuration."""
    (work / "in").mkdir(parents=True, exist_ok=True)
    shutil.copy2(scan, work / "in" / scan.name)
    # Emulated, a page takes many times its native time (over the default 900 s deadline
    # on a loaded 2-core host), and the worker's start with it.
    (work / "config.yaml").write_text(yaml.safe_dump({
        "inboxes": ["/w/in"], "outbox": "/w/out", "state_dir": "/tmp/state",
        "engine": engine, "limits": {"page_timeout_seconds": 4 * 3600},
        "worker": {"startup_timeout_seconds": 3600, "heartbeat_timeout_seconds": 600}}))
    start = time.monotonic()
    r = podman("run", "--rm", "--platform", "linux/arm64", "--entrypoint=",
               "-v", f"{cpuinfo_file(work)}:/proc/cpuinfo:ro", "-v", f"{work}:/w", *extra,
               IMAGE, "docinbox", "-c", "/w/config.yaml", "parse", "-o", "/w/out",
               f"/w/in/{scan.name}", timeout=3 * 3600, check=False)
    return time.monotonic() - start, r


def words(text: str) -> set[str]:
    return {w.lower() for w in re.findall(r"\w{4,}", text)}


def lite_page(podman: Podman, work: Path, scan: Path) -> dict[str, Any]:
    seconds, r = parse_in_image(podman, work, {"name": "lite", "fallback_engine": None}, scan)
    if r.returncode != 0:
        sys.exit(f"lite parse failed ({r.returncode}):\n{(r.stdout + r.stderr)[-4000:]}")
    md = next((work / "out").rglob("*.md")).read_text()
    truth = REPO / "bench" / "realscans" / "truth" / f"{scan.stem}.txt"
    found = None
    if truth.exists():
        expected = words(truth.read_text())
        found = round(len(expected & words(md)) / len(expected), 3)
    meta = json.loads(next((work / "out").rglob("*.meta.json")).read_text())
    return {"scan": str(scan.relative_to(REPO)) if scan.is_relative_to(REPO) else str(scan),
            "wall_seconds": round(seconds, 1), "page_seconds": meta["seconds_per_page"][0],
            "markdown_chars": len(md), "truth_words_found": found}


def mineru_page(podman: Podman, work: Path) -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    from tests.docgen import make_text_image
    from tests.tinymodel import tiny_model_once

    model = tiny_model_once(CACHE / "tiny-qwen2vl")
    scan = make_text_image(work / "tiny.png", ["A scanned page for the model"])
    engine = {"name": "mineru", "model": "/tiny", "precision": "fp32",
              "fallback_engine": None}
    seconds, r = parse_in_image(podman, work / "mineru", engine, scan,
                                ["-v", f"{model}:/tiny:ro", "-e", "HF_HUB_OFFLINE=1"])
    metas = list((work / "mineru" / "out").rglob("*.meta.json"))
    engine = json.loads(metas[0].read_text())["engine"] if metas else {}
    return {"ok": r.returncode == 0 and engine.get("name") == "mineru",
            "wall_seconds": round(seconds, 1), "returncode": r.returncode, "engine": engine,
            "tail": "" if r.returncode == 0 else (r.stdout + r.stderr)[-2000:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scan", type=Path, default=SCAN)
    ap.add_argument("--skip-build", action="store_true", help="use the image as it is")
    ap.add_argument("--mineru", action="store_true", help="also the mineru engine, tiny model")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if platform.machine() != "x86_64":
        sys.exit("this measures arm64 under emulation on an x86_64 host")
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="arm64-image-") as tmp:
        folder = Path(tmp)
        podman = make_podman(folder)
        ensure_binfmt()
        ensure_base(podman)
        result: dict[str, Any] = {"host_cpu": host_cpu(), "emulator": qemu_version(),
                                  "load_before": os.getloadavg()}
        if not args.skip_build:
            result["build_seconds"] = round(build(podman), 1)
        result["image"] = image_facts(podman)
        result["lite"] = lite_page(podman, folder / "lite", args.scan.resolve())
        if args.mineru:
            result["mineru"] = mineru_page(podman, folder)
        result["load_after"] = os.getloadavg()
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


def host_cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()} x{os.cpu_count()}"
    return platform.processor()


def qemu_version() -> str:
    out = run("qemu-aarch64-static", "--version")
    return out.splitlines()[0] if out else "?"


if __name__ == "__main__":
    main()
