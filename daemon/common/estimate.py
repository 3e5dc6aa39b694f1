"""How long a page will take on this machine, said before the first page.

The worker times a few small passes once, right after MinerU loads (`PassTimings`: the
vision tower over a small and a tiny synthetic image, a decoder prefill of a short and a
tiny row, a decode step at one row and at `engine.batch_size` rows: seconds in all), and
turns them into seconds for a typical page (`TYPICAL_PAGE`, the realistic bench's page)
with the arithmetic below.
The timings are kept in the state folder (`EstimateCache`), keyed by everything that
changes them and is known without loading the model (`EstimateKey`: CPU model, torch's ISA
caps, torch and docinbox versions, engine settings with the precision asked for), so a
second start reads them, a CPU or precision change times again, and `docinbox
check-config` can show the figure without a worker.

Pure Python, no torch: the daemon, the CLI and the worker all read it.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from daemon.common.live import PageEstimate
from daemon.output.durable import write_atomic

if TYPE_CHECKING:
    from daemon.config.settings import Config, EngineConfig

log = logging.getLogger("docinbox.estimate")

CACHE_FILE = "page-estimate.json"
# Entries kept in the cache file: a few machines/precisions a state folder has seen.
CACHE_ENTRIES = 8


@dataclass(frozen=True)
class TypicalPage:
    """The work of one typical page for MinerU2.5, per image and per block."""

    layout_patches: int  # the layout image's vision patches
    crop_patches: tuple[int, ...]  # each recognised block's crop, in the page's order
    layout_tokens: int  # what the layout step writes (+ end of turn)
    block_tokens: tuple[int, ...]  # what each recognised block writes, paired with its crop
    prompt_text_tokens: int  # chat template and prompt of one request, beside its image
    patches_per_token: int = 4  # the merger's 2x2: image tokens the decoder reads

    @property
    def images(self) -> tuple[int, ...]:
        return (self.layout_patches, *self.crop_patches)

    @property
    def prompt_tokens(self) -> int:
        """Prefill tokens of the page: every request's image tokens and prompt."""
        return sum(n // self.patches_per_token + self.prompt_text_tokens for n in self.images)


# The realistic bench's page (bench/realistic.py DEFAULT_PAGE: docling__amt_handbook_sample.pdf
# p1 at 200 DPI, docs/benchmarks.md "The realistic benchmark"): the 1036x1036 layout image
# resized by the processor to 70x70 patches; the 15 block crops mineru-vl-utils cuts for
# its 17 blocks (two images skipped) as the processor sizes them (11,864 patches with the
# layout image); 378 layout tokens and each block's text in Qwen2's BPE + end of turn (789
# in all); 26 prompt tokens per request (MinerU's chat template with "\nText Recognition:",
# the image placeholder counted in the image tokens). bench_mineru.py --realistic reads the
# same page, so its measured page seconds check this figure.
TYPICAL_PAGE = TypicalPage(
    layout_patches=4900,
    crop_patches=(480, 672, 36, 672, 672, 960, 192, 44, 864, 52, 2016, 24, 192, 64, 24),
    layout_tokens=378,
    block_tokens=(49, 77, 7, 73, 67, 99, 26, 13, 109, 8, 215, 5, 21, 15, 5),
    prompt_text_tokens=25,
)


@dataclass(frozen=True)
class PassTimings:
    """What the worker timed once after loading the model (seconds of wall time)."""

    vision_patches: int  # patches of the one image of the timed vision pass
    vision_width: int  # the tower's hidden size: attention's share of a pass grows as n/(6w)
    vision_seconds: float
    prefill_tokens: int  # one row of this many tokens through the decoder
    prefill_seconds: float
    step_seconds: float  # one decode step of one row
    batch_rows: int  # rows of the batched decode step (engine.batch_size)
    batch_step_seconds: float
    # The same two passes at a tiny size: what a pass costs whatever its size (one barrier
    # and dispatch per op, more of them on a busy machine), told apart from the per-patch
    # and per-token rates. 0 patches/tokens: not timed (every second counted as rate).
    vision_base_patches: int = 0
    vision_base_seconds: float = 0.0
    prefill_base_tokens: int = 0
    prefill_base_seconds: float = 0.0

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: object) -> PassTimings | None:
        if not isinstance(raw, Mapping):
            return None
        try:
            return cls(
                vision_patches=int(raw["vision_patches"]),
                vision_width=int(raw["vision_width"]),
                vision_seconds=float(raw["vision_seconds"]),
                prefill_tokens=int(raw["prefill_tokens"]),
                prefill_seconds=float(raw["prefill_seconds"]),
                step_seconds=float(raw["step_seconds"]),
                batch_rows=int(raw["batch_rows"]),
                batch_step_seconds=float(raw["batch_step_seconds"]),
                vision_base_patches=int(raw.get("vision_base_patches", 0)),
                vision_base_seconds=float(raw.get("vision_base_seconds", 0.0)),
                prefill_base_tokens=int(raw.get("prefill_base_tokens", 0)),
                prefill_base_seconds=float(raw.get("prefill_base_seconds", 0.0)),
            )
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True)
class PageBreakdown:
    """Seconds of one typical page by phase."""

    vision: float
    prefill: float
    layout_decode: float
    block_decode: float

    @property
    def total(self) -> float:
        return self.vision + self.prefill + self.layout_decode + self.block_decode


def vision_cost(patches: int, width: int) -> float:
    """One image through the tower in units of one patch's linear layers: per layer the
    linears take 24 w^2 FLOPs a patch (qkv, proj and a 4w MLP), attention 4 w n^2 for the
    image, so attention adds n/(6w) per patch. Attention is priced at the linears' rate
    (SDPA and GEMM measured within 10 % of each other, docs/benchmarks.md)."""
    return patches + patches * patches / (6 * max(width, 1))


def loop_passes(tokens: tuple[int, ...], slots: int) -> list[int]:
    """Rows in each decode pass of the decode loop (engine.decode: loop): a row joins as
    soon as a slot is free and leaves when done; its first token comes with its prefill.
    Drafts are not counted (what they save depends on the text)."""
    pending = deque(max(0, n - 1) for n in tokens)
    active: list[int] = []
    rows: list[int] = []
    while pending or active:
        while pending and len(active) < slots:
            active.append(pending.popleft())
        active = [left for left in active if left > 0]  # done at its prefill: leaves
        if active:
            rows.append(len(active))
            active = [left - 1 for left in active if left > 1]
    return rows


def generate_passes(tokens: tuple[int, ...], crops: tuple[int, ...], slots: int) -> list[int]:
    """Rows in each decode pass of generate() batches (engine.decode: generate): requests
    sorted by prompt size, `slots` a batch, each batch decoding to its longest row."""
    order = [t for _n, t in sorted(zip(crops, tokens, strict=True), key=lambda p: p[0])]
    rows: list[int] = []
    for i in range(0, len(order), slots):
        batch = order[i : i + slots]
        rows += [len(batch)] * max(0, max(batch) - 1)
    return rows


@dataclass(frozen=True)
class PassCost:
    """Seconds of one pass: a fixed part and a rate per unit of work (patches or tokens)."""

    fixed: float
    rate: float

    def __call__(self, units: float) -> float:
        return self.fixed + self.rate * units

    @classmethod
    def fit(cls, small: tuple[float, float], large: tuple[float, float]) -> PassCost:
        """Through two timed passes, (units, seconds) each. When the small one is missing or
        the two disagree (a busy machine made the large one no slower): all rate."""
        (u0, t0), (u1, t1) = small, large
        if u0 <= 0 or u1 <= u0 or t1 <= t0:
            return cls(0.0, t1 / max(u1, 1e-9))
        rate = (t1 - t0) / (u1 - u0)
        return cls(max(0.0, t0 - rate * u0), rate)


def step_seconds(t: PassTimings, rows: int) -> float:
    """A decode step's seconds at `rows` rows: straight between the two timed steps."""
    if t.batch_rows <= 1:
        return t.step_seconds
    share = (min(rows, t.batch_rows) - 1) / (t.batch_rows - 1)
    return t.step_seconds + share * (t.batch_step_seconds - t.step_seconds)


def page_breakdown(
    t: PassTimings, batch_size: int, decode: str, page: TypicalPage = TYPICAL_PAGE
) -> PageBreakdown:
    """The typical page's seconds from the timed passes (one page alone in the engine):
    one vision pass per image, one prefill per row (the loop) or per batch (generate())."""
    width = t.vision_width
    per_image = PassCost.fit(
        (vision_cost(t.vision_base_patches, width), t.vision_base_seconds),
        (vision_cost(t.vision_patches, width), t.vision_seconds),
    )
    per_prefill = PassCost.fit(
        (t.prefill_base_tokens, t.prefill_base_seconds), (t.prefill_tokens, t.prefill_seconds)
    )
    slots = max(1, batch_size)
    if decode == "loop":
        passes = loop_passes(page.block_tokens, slots)
        prefills = len(page.images)
    else:
        passes = generate_passes(page.block_tokens, page.crop_patches, slots)
        prefills = 1 + -(-len(page.crop_patches) // slots)
    vision = sum(per_image(vision_cost(n, width)) for n in page.images)
    prefill = prefills * per_prefill.fixed + per_prefill.rate * page.prompt_tokens
    return PageBreakdown(
        vision=vision,
        prefill=prefill,
        layout_decode=max(0, page.layout_tokens - 1) * step_seconds(t, 1),
        block_decode=sum(step_seconds(t, rows) for rows in passes),
    )


# -- what the figure depends on, and where it is kept -------------------------------------


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else the architecture."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        if line.startswith(("model name", "Model", "Hardware")):
            return line.partition(":")[2].strip()
    return platform.machine() or "unknown"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "none"


@dataclass(frozen=True)
class EstimateKey:
    """Everything that changes the timings and is known without loading the model. The
    precision a name like `auto` resolves to follows from the CPU and the ISA caps."""

    cpu: str
    isa_caps: str  # torch's ISA caps from the environment (a capped run is another CPU)
    torch: str
    docinbox: str
    engine: str  # name, runtime, model, revision, precision, decode, batch size, threads

    @property
    def digest(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def estimate_key(engine: EngineConfig, env: Mapping[str, str] | None = None) -> EstimateKey:
    from daemon import __version__
    from daemon.common.cpus import isa_caps, resolve_threads

    caps = isa_caps(os.environ if env is None else env)
    settings = (
        engine.name, engine.runtime, engine.model, engine.revision, engine.precision,
        engine.decode, engine.batch_size, resolve_threads(engine.threads),
    )  # fmt: skip
    return EstimateKey(
        cpu=cpu_model(),
        isa_caps=",".join(f"{k}={v}" for k, v in sorted(caps.items())),
        torch=_version("torch"),
        docinbox=__version__,
        engine="|".join(str(s) for s in settings),
    )


@dataclass(frozen=True)
class CachedTimings:
    timings: PassTimings
    measured_at: float  # wall clock


class EstimateCache:
    """The timings per key, as JSON in the state folder (`page-estimate.json`). A file that
    cannot be read is an empty cache: the worker times again, nothing fails."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def in_state_dir(cls, cfg: Config) -> EstimateCache:
        return cls(Path(cfg.state_dir) / CACHE_FILE)

    def _entries(self) -> dict[str, object]:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        entries = raw.get("entries") if isinstance(raw, dict) else None
        return dict(entries) if isinstance(entries, dict) else {}

    def get(self, key: EstimateKey) -> CachedTimings | None:
        entry = self._entries().get(key.digest)
        if not isinstance(entry, dict):
            return None
        timings = PassTimings.from_json(entry.get("timings"))
        at = entry.get("measured_at")
        if timings is None or not isinstance(at, int | float):
            return None
        return CachedTimings(timings, float(at))

    def put(self, key: EstimateKey, timings: PassTimings, measured_at: float) -> None:
        entries = self._entries()
        entries.pop(key.digest, None)
        entries[key.digest] = {"timings": timings.to_json(), "measured_at": measured_at}
        kept = dict(list(entries.items())[-CACHE_ENTRIES:])
        try:
            write_atomic(self.path, json.dumps({"entries": kept}, indent=1).encode())
        except OSError as exc:  # a read-only state folder: times again next start
            log.warning("cannot keep the page estimate in %s: %s", self.path, exc)


def not_applicable(engine: EngineConfig) -> str | None:
    """Why there is no timed figure for this engine, or None when MinerU runs here."""
    if engine.name != "mineru":
        return f"n/a: engine {engine.name} is not timed (lite takes seconds per page)"
    if engine.runtime != "transformers":
        return f"n/a: runtime {engine.runtime} (the pace is the server's or llama.cpp's)"
    return None


def _when(wall: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(wall))


def resolve(
    engine: EngineConfig,
    cache: EstimateCache,
    timer: Callable[[], PassTimings | None] | None,
    wall: Callable[[], float],
    key: EstimateKey | None = None,
) -> PageEstimate:
    """The figure for `engine`: from the cache when its key matches, else timed with
    `timer` (the loaded model's `time_passes`) and kept. No timer: not applicable."""
    reason = not_applicable(engine)
    if reason is not None or timer is None:
        return PageEstimate(engine.name, None, reason or "n/a: the engine cannot be timed")
    key = key or estimate_key(engine)
    cached = cache.get(key)
    if cached is None:
        timings = timer()
        if timings is None:
            return PageEstimate(engine.name, None, "n/a: the engine cannot be timed")
        cached = CachedTimings(timings, wall())
        cache.put(key, cached.timings, cached.measured_at)
        basis = f"timed at this start, {_when(cached.measured_at)}"
    else:
        basis = f"timed {_when(cached.measured_at)}, cached"
    seconds = page_breakdown(cached.timings, engine.batch_size, engine.decode).total
    return PageEstimate(engine.name, seconds, basis)


def cached(
    engine: EngineConfig, cache: EstimateCache, weights_missing: str | None = None
) -> PageEstimate:
    """What check-config shows: the cached figure, or when it will be measured. It never
    loads the model (seconds to tens of seconds and gigabytes of memory, beside a daemon
    that may already hold one). `weights_missing`: why the worker cannot load MinerU yet
    (no weights here), so the figure comes only once they are."""
    reason = not_applicable(engine)
    if reason is not None:
        return PageEstimate(engine.name, None, reason)
    found = cache.get(estimate_key(engine))
    if found is None and weights_missing is not None:
        # "At the worker's first start" would be untrue: that start loads the fallback.
        meanwhile = (
            f"engine {engine.fallback_engine} stands in until then"
            if engine.fallback_engine
            else "the worker cannot start until then"
        )
        return PageEstimate(
            engine.name,
            None,
            f"not measured yet: {weights_missing}; {meanwhile}, and MinerU is timed at the "
            "first worker start with its weights (seconds)",
        )
    if found is None:
        return PageEstimate(
            engine.name, None, "not measured yet: timed at the worker's first start (seconds)"
        )
    seconds = page_breakdown(found.timings, engine.batch_size, engine.decode).total
    return PageEstimate(engine.name, seconds, f"timed {_when(found.measured_at)}, cached")
