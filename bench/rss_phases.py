"""Where a worker's peak RSS is set: the model phase running when the high-water mark rose.

`install(runtime, log)` (in the worker, from `bench_engine.BenchMinerU` when engine.options
has `rss_log`) wraps the phases of the transformers runtime: the vision tower (forward
hooks), the decode loop's `DecodeBatch.join` (one row's vision + LM prefill) and `step`
(one pass of every active row), and `model.generate` (the generate() path). Around each it
reads the process's high-water mark (`ru_maxrss`): a phase that raised it wrote a `peak`
line (the new peak, by how much it rose, the rows and cache columns or prompt tokens it
ran on). Nested phases are attributed innermost-first (vision inside a join: the join
keeps only what rose after the tower returned). A sampler thread reads the RSS every
SAMPLE_SECONDS: each phase also writes the largest RSS sampled while it ran (`phase`
lines: its own peak even where it set no new high-water mark), and the timeline shows
what is held between phases (pages waiting, heap kept by page threads).

The high-water mark is exact, a phase's sampled maximum can miss a spike shorter than a
tick. The mark is only read, never reset (/proc/self/clear_refs would also lower the
worker peak the bench reports). `rss_summary(log)` (parent side) folds the lines up.
"""

from __future__ import annotations

import itertools
import json
import resource
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The sampler's tick: short enough to catch a transient buffer inside a phase (torch's
# kernels release the GIL); the timeline is written every WRITE_EVERY ticks.
SAMPLE_SECONDS = 0.02
WRITE_EVERY = 25


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class PhaseLog:
    """The worker side: a stack of running phases per thread, peaks and samples to a JSONL."""

    def __init__(self, path: Path) -> None:
        import psutil

        self.path = path
        self.process = psutil.Process()
        self.local = threading.local()
        self.lock = threading.Lock()
        self.running: dict[int, list[list[Any]]] = {}  # thread id -> its stack of frames
        self.t0 = time.monotonic()
        self.fh = path.open("a", encoding="utf-8")
        self.write({"kind": "start", "rss_mb": self.rss_mb(), "peak_mb": _maxrss_mb()})

    def rss_mb(self) -> float:
        return float(self.process.memory_info().rss) / 2**20

    def write(self, record: dict[str, Any]) -> None:
        record["t"] = round(time.monotonic() - self.t0, 3)
        with self.lock:
            self.fh.write(json.dumps(record) + "\n")
            self.fh.flush()

    def _stack(self) -> list[list[Any]]:
        stack: list[list[Any]] | None = getattr(self.local, "stack", None)
        if stack is None:
            stack = self.local.stack = []
            with self.lock:
                self.running[threading.get_ident()] = stack
        return stack

    def enter(self, name: str, detail: dict[str, Any]) -> None:
        # [name, high-water mark at entry, detail, largest RSS sampled, started]
        self._stack().append([name, _maxrss_mb(), detail, self.rss_mb(), time.monotonic()])

    def leave(self) -> None:
        stack = self._stack()
        if not stack:
            return
        name, base, detail, sampled, started = stack.pop()
        after = _maxrss_mb()
        self.write(
            {
                "kind": "phase",
                "phase": name,
                "max_rss_mb": round(max(sampled, self.rss_mb()), 1),
                "seconds": round(time.monotonic() - started, 3),
                **detail,
            }
        )
        if after > base:
            rise = round(after - base, 1)
            self.write({"kind": "peak", "phase": name, "peak_mb": after, "rise_mb": rise, **detail})
        if stack:  # the enclosing phase keeps only what rises from here on
            stack[-1][1] = max(stack[-1][1], after)

    def wrap(
        self, name: str, fn: Callable[..., Any], detail: Callable[..., dict[str, Any]]
    ) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            self.enter(name, detail(*args, **kwargs))
            try:
                return fn(*args, **kwargs)
            finally:
                self.leave()

        return run

    def sample_forever(self) -> None:
        for tick in itertools.count(1):
            time.sleep(SAMPLE_SECONDS)
            rss = self.rss_mb()
            with self.lock:
                for stack in self.running.values():
                    for frame in list(stack):
                        frame[3] = max(frame[3], rss)
                phases = sorted({s[-1][0] for s in self.running.values() if s})
            if tick % WRITE_EVERY:
                continue
            self.write(
                {
                    "kind": "sample",
                    "rss_mb": round(rss, 1),
                    "peak_mb": _maxrss_mb(),
                    "phases": phases,
                }
            )


def _join_detail(batch: Any, _index: int, request: Any) -> dict[str, Any]:
    mask = batch.mask
    return {
        "rows": len(batch.rows),
        "cols": 0 if mask is None else int(mask.shape[1]),
        "prompt": int(request.inputs["input_ids"].shape[1]),
    }


def _step_detail(batch: Any) -> dict[str, Any]:
    mask = batch.mask
    return {"rows": len(batch.rows), "cols": 0 if mask is None else int(mask.shape[1])}


def _generate_detail(*_args: Any, **kwargs: Any) -> dict[str, Any]:
    ids = kwargs.get("input_ids")
    return {} if ids is None else {"rows": int(ids.shape[0]), "prompt": int(ids.shape[1])}


def install(runtime: Any, path: Path) -> PhaseLog:
    """Wrap the loaded transformers runtime's phases (see the module docstring)."""
    from daemon.engines.mineru.runtimes import decode_loop

    log = PhaseLog(path)
    model = runtime.loaded.model
    visual = model.model.visual

    def vision_pre(_module: Any, args: Any) -> None:
        log.enter("vision", {"patches": int(args[0].shape[0]) if args else 0})

    visual.register_forward_pre_hook(vision_pre)
    visual.register_forward_hook(lambda *_a: log.leave())
    model.generate = log.wrap("generate", model.generate, _generate_detail)
    loop = getattr(runtime, "loop", None)
    if loop is not None and loop.release is not None:  # the heap trim before each join
        loop.release = log.wrap("release", loop.release, lambda: {})
    batch = decode_loop.DecodeBatch
    batch.join = log.wrap("join", batch.join, _join_detail)  # type: ignore[method-assign]
    batch.step = log.wrap("step", batch.step, _step_detail)  # type: ignore[method-assign]
    threading.Thread(target=log.sample_forever, name="rss-sampler", daemon=True).start()
    return log


def rss_summary(path: Path) -> dict[str, Any]:
    """Per phase: the highest peak it set and the rise that took it there (`peaks_set`),
    its largest sampled RSS (`phase_max_rss`); which phase set the worker's peak; the RSS
    between phases (timeline samples with no phase running)."""
    if not path.is_file():
        return {}
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    peaks = [r for r in lines if r["kind"] == "peak"]
    samples = [r for r in lines if r["kind"] == "sample"]
    start: dict[str, Any] = next((r for r in lines if r["kind"] == "start"), {})
    by_phase: dict[str, dict[str, Any]] = {}
    for r in peaks:
        best = by_phase.get(r["phase"])
        if best is None or r["peak_mb"] > best["peak_mb"]:
            by_phase[r["phase"]] = {k: v for k, v in r.items() if k not in ("kind", "phase")}
    sampled: dict[str, dict[str, Any]] = {}
    for r in (r for r in lines if r["kind"] == "phase"):
        best = sampled.get(r["phase"])
        if best is None or r["max_rss_mb"] > best["max_rss_mb"]:
            sampled[r["phase"]] = {k: v for k, v in r.items() if k not in ("kind", "phase")}
    top = max(peaks, key=lambda r: r["peak_mb"], default=None)
    idle = [s["rss_mb"] for s in samples if not s["phases"]]
    return {
        "after_load_rss_mb": start.get("rss_mb"),
        "after_load_peak_mb": start.get("peak_mb"),
        "peak_mb": max((s["peak_mb"] for s in samples), default=None),
        "peak_set_by": None if top is None else {k: v for k, v in top.items() if k != "kind"},
        "peaks_set": by_phase,
        "phase_max_rss": sampled,
        "rss_sampled_max_mb": max((s["rss_mb"] for s in samples), default=None),
        "rss_between_phases_max_mb": max(idle, default=None),
    }
