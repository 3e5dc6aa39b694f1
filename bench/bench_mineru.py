"""CPU benchmark of the `mineru` engine: docinbox's paths against the reference path a user
would copy from mineru-vl-utils' README and against MinerU 4's own CPU engine (llama.cpp).

Every path runs in its own fresh subprocess on the same rendered page, so cold start and peak
RSS are per path. Random weights stop at random places, so the work is fixed by a plan: the
layout step's token count and layout string, and each block's token count (see
bench_engine.py for how it is forced and timed).

- default ("forced") mode: page 1 of docling__2305.03393v1-pg9.pdf, a fixed layout of 4
  blocks, N layout tokens and M tokens per block (`--layout-tokens`, `--block-tokens`);
- `--realistic`: a real corpus page (docling__amt_handbook_sample.pdf, 17 blocks on their
  real regions from its text layer; bench/realistic.py), the layout step forced to the token
  count of MinerU's layout string for those blocks and each block to the token count of its
  real text (Qwen2's BPE), plus the document paths: a 4-page PDF (docling__normal_4pages)
  and a 12-page one (the first 12 pages of docling__redp5110_sampled) through the real
  supervisor and worker (`daemon.cli.parse.parse_files`), each page forced to its own plan:
  `document` with engine.page_batch 1, `document-batched` with the default page_batch
  (several pages' model steps in shared generate() calls); seconds per page and where the
  time went (vision, LM prefill, decode, outside generate()).

Paths: `reference` (mineru-vl-utils README: load_transformers_model(path) -> dtype="auto",
+ MinerUClient(backend="transformers").two_step_extract; device_map=None instead of "auto",
which needs accelerate; the processor is docinbox's image-only Qwen2-VL processor, because
transformers' AutoProcessor needs torchvision, not installed here), `auto` (docinbox's
default precision) and `fp32`/`bf16`/`mixed`/`int8`/`bf16-int8` (MinerUEngine, text layer
off, engine.batch_size blocks per generate(), engine.decode: generate), `auto-loop` (`auto`
with engine.decode: loop, the decode loop of our own; page seconds and the loop's passes and
drafts, no per-phase split), `textlayer` (the defaults a user gets:
precision auto, text_layer auto), `llama-cpp` (MinerU 4's mineru-llama-cpp engine on the
Q8_0 GGUF pair of the same random model, in bench/.venv-llama; bench/llama_child.py) and
`document`, `document-batched` (realistic only).

    python bench/make_model.py          # once
    python bench/make_gguf.py           # once, for llama-cpp
    python bench/bench_mineru.py --realistic --out ~/.cache/docinbox-bench/realistic.json
    python bench/bench_mineru.py --report ~/.cache/docinbox-bench/realistic.json

Results: a JSON file (per path: timings, per-generate-call details, RSS, load info, and
on the MinerUEngine paths the page estimate the worker would show, timed the worker's way
on the loaded model before the page: `estimate_seconds`, held against `page_seconds`) and
Markdown tables on stdout. `--token-scale 0.05` shrinks every forced count for a smoke run.

The parts: bench/mineru_paths.py (the paths, their defaults, the page's plan),
bench/mineru_child.py (one path in its fresh process), bench/mineru_report.py (the
tables); this file runs the paths in order and records the machine and the load.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# Run as a script (`python bench/bench_mineru.py`), bench/ is on the path, not the repo.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.mineru_child import child
from bench.mineru_paths import (
    ALL_PATHS,
    BENCH,
    DEFAULT_GGUF,
    DEFAULT_MODEL,
    DEFAULT_OUT,
    DOCUMENT_PATHS,
    FORCED_PATHS,
    LLAMA_PYTHON,
    REALISTIC_PATHS,
    REPO,
    build_plans,
    prepare_page,
    warm_cache,
)
from bench.mineru_report import markdown, merge


def machine_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {"python": platform.python_version(), "cpu_count": os.cpu_count()}
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in lscpu.splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("Model name", "Core(s) per socket", "Thread(s) per core", "CPU(s)"):
                facts[key.strip()] = value.strip()
    except OSError:
        pass
    sys.path.insert(0, str(REPO))
    from daemon.common.cpus import cpu_flags
    from daemon.engines.mineru.runtimes.transformers_model import auto_precision

    flags = cpu_flags()
    facts["flags"] = sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "f16c")))
    facts["auto_precision"] = auto_precision(flags)
    import psutil

    facts["mem_total_gb"] = round(psutil.virtual_memory().total / 2**30, 1)
    try:
        import torch
        import transformers

        from daemon.engines.mineru.runtimes.transformers_model import isa_caps

        facts["torch"] = torch.__version__
        facts["transformers"] = transformers.__version__
        # What torch really uses: ISA caps (ATen's, oneDNN's, MKL's) reproduce an older
        # CPU on a newer one.
        facts["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        facts["isa_caps"] = isa_caps()
    except ImportError:
        pass
    return facts

def loadavg() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def run_path(path: str, base: dict[str, Any], logs: Path, timeout: float) -> dict[str, Any]:
    result_file = logs / f"{path}.json"
    result_file.unlink(missing_ok=True)
    spec = {**base, "path": path, "result_path": str(result_file)}
    load_before = loadavg()
    spec["spawn_wall"] = time.time()
    if path == "llama-cpp":
        spec_file = logs / "llama-cpp.spec.json"
        spec_file.write_text(json.dumps(spec))
        cmd = [str(LLAMA_PYTHON), str(BENCH / "llama_child.py"), str(spec_file), str(result_file)]
    else:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
    with (logs / f"{path}.log").open("w") as log:
        try:
            proc = subprocess.run(
                cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, check=False
            )
            returncode = proc.returncode
        except subprocess.TimeoutExpired:
            returncode = -1
    wall = time.time() - spec["spawn_wall"]
    if returncode != 0 or not result_file.is_file():
        return {"path": path, "error": f"exit {returncode}, see {logs / (path + '.log')}"}
    record: dict[str, Any] = json.loads(result_file.read_text())
    record["subprocess_wall_seconds"] = round(wall, 1)
    record["loadavg_before"] = load_before
    record["loadavg_after"] = loadavg()
    return record




def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument(
        "--report",
        type=Path,
        nargs="+",
        help="print the tables of results files (or per-path records), run nothing",
    )
    parser.add_argument("--realistic", action="store_true", help="a real page's work (above)")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--gguf", type=Path, default=DEFAULT_GGUF, help="make_gguf.py's folder")
    parser.add_argument("--pdf", type=Path, help="the page's PDF")
    parser.add_argument("--page", type=int, help="1-based page of --pdf")
    parser.add_argument(
        "--document",
        type=Path,
        action="append",
        help="realistic: a multi-page PDF for the document paths (repeat; default: the 4-page "
        "and the 12-page document of bench/realistic.py)",
    )
    parser.add_argument("--dpi", type=int, default=200)
    parser.add_argument("--layout-tokens", type=int, default=64, help="forced mode: N")
    parser.add_argument("--block-tokens", type=int, default=32, help="forced mode: M per block")
    parser.add_argument("--token-scale", type=float, default=1.0, help="< 1: smoke runs only")
    parser.add_argument("--threads", type=int, default=0, help="engine threads (0 = cores)")
    parser.add_argument("--batch-size", type=int, default=8, help="engine.batch_size")
    parser.add_argument(
        "--page-batch",
        type=int,
        help="document-batched: engine.page_batch (default: the config default)",
    )
    parser.add_argument(
        "--drafts",
        choices=("default", "positions"),
        default="default",
        help="auto-loop, auto-drafted: `positions` replaces the int8 decoder's pass scheduler "
        "(AVX2) with the position budget, to time what the scheduler buys",
    )
    parser.add_argument(
        "--packing",
        choices=("default", "off"),
        default="default",
        help="engine paths: `off` keeps the bf16 weights unpacked (plain F.linear), to time "
        "what packing them (runtimes/packed_linear.py) buys",
    )
    parser.add_argument(
        "--loop-precision",
        default="auto",
        help="auto-loop, auto-drafted: the engine's precision (default auto), e.g. bf16 to "
        "time the loop on a bf16 decoder",
    )
    parser.add_argument("--paths", help="comma-separated, in order (default: per mode)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--timeout", type=float, default=5400.0, help="per path, seconds")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.report:
        merged = merge(args.report)
        print(markdown(merged))
        return 0
    if args.child:
        spec = json.loads(args.child)
        record = child(spec)
        Path(spec["result_path"]).write_text(json.dumps(record, indent=2))
        return 0
    paths = _paths(parser, args)
    model_dir: Path = args.model.expanduser().resolve()
    gguf_dir: Path = args.gguf.expanduser().resolve()
    ggufs = sorted(gguf_dir.glob("*-Q8_0.gguf"))
    main_gguf = next((g for g in ggufs if not g.name.startswith("mmproj-")), None)
    mmproj = next((g for g in ggufs if g.name.startswith("mmproj-")), None)
    if "llama-cpp" in paths and not (main_gguf and mmproj and LLAMA_PYTHON.is_file()):
        print(
            f"llama-cpp: skipped (needs {LLAMA_PYTHON} and the Q8_0 pair in {gguf_dir}: see "
            "docs/benchmarks.md)",
            flush=True,
        )
        paths.remove("llama-cpp")
    out: Path = args.out.expanduser()
    logs = out.parent / (out.stem + "-logs")
    logs.mkdir(parents=True, exist_ok=True)
    plans = build_plans(args, model_dir)
    page = prepare_page(plans["pdf"], plans["page_idx"], args.dpi, out.parent)
    # Still in /proc/self/environ of the children: the ISA caps apply to every path.
    warm_cache(model_dir, gguf_dir)
    base = {
        "model": str(model_dir),
        "gguf": str(main_gguf),
        "mmproj": str(mmproj),
        "threads": args.threads,
        "batch_size": args.batch_size,
        "page_batch": args.page_batch,
        "drafts": args.drafts,
        "packing": args.packing,
        "loop_precision": args.loop_precision,
        "token_scale": args.token_scale,
        "plan": plans["plan"],
        "documents": plans.get("documents", []),
        **page,
    }
    results: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_facts(),
        "settings": {
            "model": str(model_dir),
            "realistic": args.realistic,
            "plan": plans["plan"],
            "documents": plans.get("documents", []),
            "token_scale": args.token_scale,
            "batch_size": args.batch_size,
            "page": page,
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
        },
        "paths": [],
    }
    _run_paths(paths, base, results, out, logs, args.timeout)
    print()
    print(markdown(results))
    print(f"\nresults: {out}")
    return 0


def _paths(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The paths asked for (or the mode's), checked; `auto`'s twin under its own name goes."""
    default = REALISTIC_PATHS if args.realistic else FORCED_PATHS
    paths = [p.strip() for p in (args.paths or ",".join(default)).split(",") if p.strip()]
    unknown = set(paths) - set(ALL_PATHS)
    if unknown:
        parser.error(f"unknown paths {sorted(unknown)} (known: {', '.join(ALL_PATHS)})")
    if set(paths) & set(DOCUMENT_PATHS) and not args.realistic:
        parser.error("the document paths need --realistic")
    from daemon.engines.mineru.runtimes.transformers_model import auto_precision

    if "auto" in paths and auto_precision() in paths:
        # The same configuration twice: keep `auto`, the name the target is stated in.
        print(f"{auto_precision()}: skipped, it is what auto picks here", flush=True)
        paths.remove(auto_precision())
    return paths


def _run_paths(
    paths: list[str], base: dict[str, Any], results: dict[str, Any], out: Path, logs: Path,
    timeout: float,
) -> None:
    """Each path in turn, in its own process; the results file is rewritten after each."""
    for path in paths:
        print(f"[{time.strftime('%H:%M:%S')}] {path} (load {loadavg()}) ...", flush=True)
        record = run_path(path, base, logs, timeout)
        results["paths"].append(record)
        results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        out.write_text(json.dumps(results, indent=2))
        summary = record.get("error") or (
            f"page {record['page_seconds']}s"
            if "page_seconds" in record
            else ", ".join(
                f"{Path(d['document']).name} {d.get('seconds_per_page')} s/page"
                for d in record.get("documents", [])
            )
        )
        print(f"[{time.strftime('%H:%M:%S')}] {path}: {summary}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
