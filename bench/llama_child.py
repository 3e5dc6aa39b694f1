"""One page through MinerU 4's CPU engine, for `bench_mineru.py` (path `llama-cpp`).

Runs in its own venv (bench/.venv-llama: mineru-llama-cpp + mineru-vl-utils), never imports
docinbox. The engine is built the way MinerU 4.0.12's llama.cpp runtime builds it: an
in-process `mineru_llama_cpp.Engine` on the Q8_0 main model + Q8_0 mmproj with its default
4 parallel slots, driven by `MinerUClient(backend="llama-cpp-engine")` with MinerU 4's
client flags; blocks go through the client's thread pool, concurrently across the slots.

Forced work, as on the transformers paths: each generate() is given its planned token count
as `n_predict` with `ignore_eos`, and its "length" finish is reported as a normal stop (the
client raises on truncation, and here the length is the plan, not a truncation); the layout
output is replaced by the plan's layout string after its call has run.
One deviation from MinerU 4's flags: `image_analysis=False`, as on every other path, so all
paths recognise the same blocks (MinerU 4 turns it on for MinerU2.5-Pro).

    bench/.venv-llama/bin/python bench/llama_child.py SPEC_JSON RESULT_JSON
"""

from __future__ import annotations

import dataclasses
import json
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any


def _key(bbox: Any) -> tuple[int, int, int, int]:
    x0, y0, x1, y1 = (round(float(v) * 1000) for v in bbox)
    return x0, y0, x1, y1


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    t_import = time.monotonic()
    from mineru_llama_cpp import Engine
    from mineru_vl_utils import MinerUClient
    from PIL import Image

    import_seconds = time.monotonic() - t_import
    plan = spec["plan"]
    scale = float(spec.get("token_scale", 1.0))

    def scaled(n: int) -> int:
        return max(2, round(n * scale))

    planned = {tuple(b["bbox"]): b["tokens"] for b in plan["blocks"] if b["tokens"] > 0}
    image = Image.open(spec["image"]).convert("RGB")
    image.load()

    t_load = time.monotonic()
    engine = Engine(
        spec["gguf"],
        spec["mmproj"],
        n_parallel=spec.get("n_parallel", 4),
        n_threads=spec.get("n_threads", -1),
    )
    client: Any = MinerUClient(
        backend="llama-cpp-engine",
        llama_cpp_engine=engine,
        enable_table_formula_eq_wrap=True,
        image_analysis=False,
        enable_cross_page_table_merge=False,
        use_tqdm=False,
    )
    load_seconds = time.monotonic() - t_load
    ready_wall = time.time()

    state: dict[str, Any] = {"phase": "layout", "layout_parsed_at": 0.0}
    forced: dict[int, int] = {}
    calls: list[dict[str, Any]] = []
    lock = threading.Lock()
    helper = client.helper
    original_parse = helper.parse_layout_output

    def parse_layout_output(output: str) -> Any:
        state["layout_parsed_at"] = time.monotonic()
        state["phase"] = "block"
        return original_parse(plan["layout"])

    helper.parse_layout_output = parse_layout_output
    original_prepare = helper.prepare_for_extract

    def prepare_for_extract(img: Any, blocks: Any, *args: Any, **kwargs: Any) -> Any:
        images, prompts, params, indices = original_prepare(img, blocks, *args, **kwargs)
        for crop, idx in zip(images, indices, strict=True):
            forced[id(crop)] = scaled(planned.get(_key(blocks[idx].bbox), 32))
        return images, prompts, params, indices

    helper.prepare_for_extract = prepare_for_extract
    vlm = client.client
    original_predict = vlm.predict

    def predict(
        img: Any, prompt: str = "", sampling_params: Any = None, priority: Any = None
    ) -> Any:
        n = scaled(plan["layout_tokens"]) if state["phase"] == "layout" else forced[id(img)]
        from mineru_vl_utils import MinerUSamplingParams

        params = sampling_params or MinerUSamplingParams()
        params = dataclasses.replace(params, max_new_tokens=n)
        return original_predict(img, prompt, params, priority)

    vlm.predict = predict
    original_generate = engine.generate

    def generate(messages: Any, sampling_params: Any = None) -> Any:
        sp = dataclasses.replace(sampling_params, ignore_eos=True)
        started = time.monotonic()
        result = original_generate(messages, sp)
        ended = time.monotonic()
        timings = result.timings
        with lock:
            calls.append(
                {
                    "phase": state["phase"],
                    "started": started,
                    "total_seconds": ended - started,
                    "prompt_tokens": timings.prompt_n if timings else None,
                    "prompt_ms": timings.prompt_ms if timings else None,
                    "decode_tokens": timings.predicted_n if timings else None,
                    "decode_ms": timings.predicted_ms if timings else None,
                }
            )
        return dataclasses.replace(result, finish_reason="stop")

    engine.generate = generate  # type: ignore[method-assign]

    t0 = time.monotonic()
    cpu0 = time.process_time()
    blocks = client.two_step_extract(image)
    t1 = time.monotonic()
    cpu1 = time.process_time()
    engine.close()
    record = {
        "path": "llama-cpp",
        "import_seconds": round(import_seconds, 2),
        "load_seconds": round(load_seconds, 2),
        "cold_start_seconds": round(ready_wall - spec["spawn_wall"], 2),
        "dtype_vision": "Q8_0 (mmproj)",
        "dtype_decoder": "Q8_0",
        "threads": spec.get("n_threads", -1),
        "n_parallel": spec.get("n_parallel", 4),
        "layout_seconds": round(state["layout_parsed_at"] - t0, 2),
        "recognition_seconds": round(t1 - state["layout_parsed_at"], 2),
        "page_seconds": round(t1 - t0, 2),
        "page_cpu_per_wall": round((cpu1 - cpu0) / max(t1 - t0, 1e-9), 2),
        "blocks_out": len(blocks),
        "calls": calls,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    Path(sys.argv[2]).write_text(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
