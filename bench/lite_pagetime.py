"""The lite engine's time on a fixed set of pages, for comparing two checkouts in one run.

    python bench/lite_pagetime.py --checkout /path/to/old --checkout . --rounds 3

Each round runs every checkout once, alternating, each in a fresh process (so one's
warm caches do not flatter the next), the engine loaded before the clock starts and the
page rendered outside it. Reported per run: the process's CPU seconds (both threads: the
comparable figure when other work shares the machine) and wall seconds, in total and per
page, and the load average at its start. The pages are the ones docs/quality.md has timed
since the reading-order work: two born-digital pages rendered, both pages of a
low-resolution TIFF, a turned page, two real scans.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGES = [
    "pdf/docling__ocr_test.pdf",
    "images/docling__webp-test.webp",
    "images/docling__2206.01062.tif",
    "pdf/docling__ocr_test_rotated_180.pdf",
    "realscans/tapus-gallica-btv1b10583038c-f29.jpg",
    "realscans/dta-bebel-frau-1879-0146.png",
]

_CHILD = r"""
import json, os, sys, time
sys.path.insert(0, os.getcwd())
sys.path.insert(1, {bench!r})
import quality as q
from daemon.config.settings import LimitsConfig
corpus, realscans, pages = {corpus!r}, {realscans!r}, {pages!r}
engine = q.make_engine(None)
out = []
for name in pages:
    root, rel = (realscans, name.split("/", 1)[1]) if name.startswith("realscans/") else (
        corpus, name)
    from pathlib import Path
    path = Path(root) / rel
    info = q.inspect_document(path, passwords=(), limits=LimitsConfig())
    for idx in range(info.page_count):
        page = q.as_handed_on(q.render_page(
            path, info, idx, dpi=200, max_long_side=4000, max_image_pixels=180_000_000))
        cpu, wall = time.process_time(), time.perf_counter()
        engine.parse_page(page, q.PageOptions(), q.no_progress)
        out.append(dict(page=f"{{name}}#{{idx + 1}}", cpu=time.process_time() - cpu,
                        wall=time.perf_counter() - wall))
print(json.dumps(out))
"""


def run_once(checkout: Path, corpus: Path) -> list[dict[str, float | str]]:
    code = _CHILD.format(
        bench=str(REPO / "bench"),
        corpus=str(corpus),
        realscans=str(REPO / "bench" / "realscans" / "images"),
        pages=PAGES,
    )
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=checkout, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: {done.stderr[-2000:]}")
    result: list[dict[str, float | str]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkout", type=Path, action="append", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--corpus", type=Path, default=REPO.parent / "shared" / "corpus")
    args = parser.parse_args()
    for rnd in range(1, args.rounds + 1):
        for checkout in args.checkout:
            load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
            pages = run_once(checkout.resolve(), args.corpus)
            cpu = sum(float(p["cpu"]) for p in pages)
            wall = sum(float(p["wall"]) for p in pages)
            each = " ".join(f"{float(p['cpu']):.2f}" for p in pages)
            print(
                f"round {rnd} {checkout}: cpu {cpu:.2f} s, wall {wall:.2f} s, "
                f"load {load}; per page cpu {each}",
                flush=True,
            )


if __name__ == "__main__":
    main()
