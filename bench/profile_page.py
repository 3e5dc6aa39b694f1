"""Where the realistic page's seconds go, part by part, on the engine's own loaded model.

The measurements behind docs/benchmarks.md's section of 2026-12-07 (the three fixes), each
a mode; random weights of the real shape (bench/make_model.py), `auto` precision, torch's
threads as the engine sets them. Run alone on the machine; each line says the load.

    python bench/make_model.py
    python bench/profile_page.py prefills        # the page's 15 block prompts, one at a time:
                                                 # seconds of vision and of the language model
    python bench/profile_page.py step [--context 1300] [--rows 1]   # decode steps, by operator
    python bench/profile_page.py verify [--context 1300] [--rows 4] [--k 2]  # one verify pass
                                                 # (rows x (1 + k) positions), by operator
    python bench/profile_page.py tower-faults [--side 70] [--passes 2]
    GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=2147483648 \\
        python bench/profile_page.py tower-faults    # the layout tower and its page faults,
                                                     # glibc's defaults, then the kept heap
    python bench/profile_page.py attention-layout    # SDPA and the chunked kernel on the
                                                     # tower's q/k/v layout and on contiguous heads
    python bench/profile_page.py int8-rows           # the int8 kernel against dequantise +
                                                     # bf16 GEMM, all decoder linears, by rows
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from bench.bench_verify import text_prompt
from bench.make_model import DEFAULT_OUT

# The realistic page's block crops (patches high x wide), as its calls recorded them.
BLOCK_GRIDS = ((10, 48), (14, 48), (14, 48), (14, 48), (18, 48), (20, 48), (2, 12), (4, 6),
               (2, 18), (2, 22), (2, 26), (2, 32), (4, 48), (4, 48), (42, 48))  # fmt: skip
# MinerU2.5's decoder linears in one layer (out, in), 24 layers.
DECODER_LINEARS = ((896, 896), (128, 896), (128, 896), (896, 896), (4864, 896), (4864, 896),
                   (896, 4864))  # fmt: skip


def load() -> str:
    return f"load {os.getloadavg()[0]:.2f}"


def best_ms(fn: Callable[[], object], repeat: int = 2) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1000


def loaded_model() -> Any:
    from daemon.engines.mineru.runtimes.transformers_model import load_model

    return load_model(str(DEFAULT_OUT), None, "auto")


def prefills() -> None:
    """Each block prompt through the model alone (logits_to_keep=1, as a prefill)."""
    from daemon.engines.mineru.runtimes.transformers_model import load_processor

    model = loaded_model().model
    processor = load_processor(DEFAULT_OUT)
    rng = np.random.default_rng(0)
    vision = [0.0]
    forward = model.model.visual.forward

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.monotonic()
        try:
            return forward(*args, **kwargs)
        finally:
            vision[0] += time.monotonic() - start

    model.model.visual.forward = timed
    content = [{"type": "image"}, {"type": "text", "text": "\nText Recognition:"}]
    messages: Any = [{"role": "user", "content": content}]  # MinerU's content list
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    total = 0.0
    print(f"| prompt tokens | forward s | vision s | language model s | ({load()})")
    for high, wide in BLOCK_GRIDS:
        pixels = rng.integers(0, 255, (high * 14, wide * 14, 3), dtype=np.uint8)
        inputs = processor(text=[text], images=[Image.fromarray(pixels)], return_tensors="pt")
        inputs = {k: v.to(model.dtype) if v.is_floating_point() else v for k, v in inputs.items()}
        ids = inputs.pop("input_ids")
        vision[0] = 0.0
        start = time.monotonic()
        with torch.no_grad():
            model(input_ids=ids, logits_to_keep=1, **inputs)
        took = time.monotonic() - start
        total += took - vision[0]
        print(f"| {ids.shape[1]} | {took:.2f} | {vision[0]:.2f} | {took - vision[0]:.2f} |",
              flush=True)  # fmt: skip
    print(f"language model, all prompts: {total:.2f} s ({load()})")


def joined_batch(context: int, rows: int) -> tuple[Any, Any, torch.Generator]:
    """(the loaded model, a DecodeBatch of `rows` random text prompts of `context` tokens
    that never end, the generator that made them)."""
    from daemon.engines.mineru.runtimes.decode_loop import (
        DecodeBatch,
        DecodeRequest,
        greedy_processors,
    )

    model = loaded_model().model
    processors = greedy_processors(model, {"no_repeat_ngram_size": 100, "do_sample": False})
    batch = DecodeBatch(model, processors, {-1})
    generator = torch.Generator().manual_seed(0)
    for row in range(rows):
        batch.join(row, DecodeRequest(text_prompt(1, context, 150_000, generator), 1 << 20))
    return model, batch, generator


def step(context: int, rows: int = 1) -> None:
    """Decode steps of the decode loop for `rows` rows after text prompts (no drafts), and
    their operators."""
    from torch.profiler import profile

    _model, batch, _generator = joined_batch(context, rows)
    for _ in range(5):
        batch.step()
    start = time.monotonic()
    for _ in range(20):
        batch.step()
    took = (time.monotonic() - start) / 20 * 1000
    print(f"context {context}, {rows} row(s): {took:.1f} ms a step ({load()})")
    with profile() as run:
        for _ in range(10):
            batch.step()
    print(run.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


def verify(context: int, rows: int, k: int) -> None:
    """One verify pass of the decode loop (rows x (1 + k) positions after text prompts of
    `context` tokens, the cache cropped back after each), its time and its operators."""
    from torch.profiler import profile

    model, batch, generator = joined_batch(context, rows)
    assert batch.cache is not None and batch.mask is not None
    cache, width = batch.cache, k + 1
    ids = torch.randint(0, 150_000, (rows, width), generator=generator)
    positions = torch.stack([row.next_pos + torch.arange(width) for row in batch.rows])
    mask = torch.cat([batch.mask, torch.ones((rows, width), dtype=torch.long)], dim=1)

    def one_pass() -> None:
        with torch.no_grad():
            model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions.unsqueeze(0).expand(3, -1, -1),
                cache=cache,
                use_cache=True,
            )
        cache.crop(-width)

    took = best_ms(one_pass, repeat=3)
    print(f"context {context}, {rows} row(s) x {width} positions: {took:.1f} ms a pass ({load()})")
    with profile() as run:
        for _ in range(3):
            one_pass()
    print(run.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


def tower_faults(side: int, passes: int) -> None:
    """The vision tower over a side x side image, its minor page faults and system time."""
    visual = loaded_model().model.model.visual
    grid = torch.tensor([[1, side, side]])
    pixels = torch.randn(side * side, 3 * 2 * 14 * 14).to(visual.get_dtype())
    print(f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')!r}")
    with torch.no_grad():
        for n in range(passes):
            before = resource.getrusage(resource.RUSAGE_SELF)
            start = time.monotonic()
            visual(pixels, grid_thw=grid)
            took = time.monotonic() - start
            after = resource.getrusage(resource.RUSAGE_SELF)
            faults = after.ru_minflt - before.ru_minflt
            system = after.ru_stime - before.ru_stime
            user = after.ru_utime - before.ru_utime
            print(f"pass {n}: {took:.2f} s, {faults} minor faults, system {system:.2f} s, "
                  f"user {user:.2f} s ({load()})", flush=True)  # fmt: skip


def attention_layout() -> None:
    """One layer's attention over the layout image (16 heads of 80, 4,900 patches, bf16):
    q/k/v as the tower hands them against contiguous heads, best of 2 wall."""
    from daemon.engines.mineru.runtimes.transformers_model import keep_freed_memory
    from daemon.engines.mineru.runtimes.vision_attention import (
        query_chunked_attention,
        tower_layout,
    )

    keep_freed_memory()
    qkv = torch.randn(4900, 3, 16, 80, generator=torch.Generator().manual_seed(0)).bfloat16()
    tower = tower_layout(qkv)
    contiguous = tuple(t.contiguous() for t in tower)
    scale = 80**-0.5
    for name, (q, k, v) in (("the tower's layout", tower), ("contiguous heads", contiguous)):
        sdpa = best_ms(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(  # type: ignore[misc]
            q[None], k[None], v[None], scale=scale))  # fmt: skip
        chunked = best_ms(lambda q=q, k=k, v=v: query_chunked_attention(  # type: ignore[misc]
            q, k, v, scale))  # fmt: skip
        print(f"{name}: SDPA {sdpa:.0f} ms, chunked {chunked:.0f} ms "
              f"({chunked / sdpa:.2f}x; {load()})", flush=True)  # fmt: skip


def int8_rows() -> None:
    """All 168 decoder linears by rows: the int8 kernel, and dequantise + bf16 GEMM."""
    from daemon.engines.mineru.runtimes.int8_linear import Int8WeightOnlyLinear

    torch.manual_seed(0)
    layers = [
        Int8WeightOnlyLinear.from_linear(
            torch.nn.Linear(i, o, bias=False), torch.bfloat16, torch.bfloat16
        )
        for o, i in DECODER_LINEARS * 24
    ]

    def kernel(layer: Int8WeightOnlyLinear, x: torch.Tensor) -> object:
        return torch.ops.aten._weight_int8pack_mm(
            x.to(torch.bfloat16), layer.weight_int8, layer.scales
        )

    def dense(layer: Int8WeightOnlyLinear, x: torch.Tensor) -> object:
        weight = layer.weight_int8.to(torch.bfloat16) * layer.scales[:, None]
        return F.linear(x.to(torch.bfloat16), weight)

    print(f"| rows | int8 kernel ms | dequantise + bf16 GEMM ms | ({load()})")
    for rows in (1, 2, 4, 8, 12, 16, 20, 24, 31, 48, 64):
        xs = {n: torch.randn(rows, n) for n in (896, 4864)}

        def every_layer(
            run: Callable[[Int8WeightOnlyLinear, torch.Tensor], object],
            xs: dict[int, torch.Tensor] = xs,
        ) -> object:
            return [run(layer, xs[layer.in_features]) for layer in layers]

        cells = [best_ms(lambda run=run: every_layer(run), 3) for run in (kernel, dense)]  # type: ignore[misc]
        print(f"| {rows} | {cells[0]:.1f} | {cells[1]:.1f} |", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "mode",
        choices=["prefills", "step", "verify", "tower-faults", "attention-layout", "int8-rows"],
    )
    parser.add_argument("--context", type=int, default=1300, help="step: prompt tokens")
    parser.add_argument("--rows", type=int, help="step, verify: rows (default 1, verify 4)")
    parser.add_argument("--k", type=int, default=2, help="verify: draft tokens a row")
    parser.add_argument("--side", type=int, default=70, help="tower-faults: patches a side")
    parser.add_argument("--passes", type=int, default=2, help="tower-faults: passes")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    print(f"torch {torch.__version__}, kernels {torch.backends.cpu.get_cpu_capability()}, "
          f"{torch.get_num_threads()} thread(s), {load()}")  # fmt: skip
    if args.mode == "prefills":
        prefills()
    elif args.mode == "step":
        step(args.context, args.rows or 1)
    elif args.mode == "verify":
        verify(args.context, args.rows or 4, args.k)
    elif args.mode == "tower-faults":
        tower_faults(args.side, args.passes)
    elif args.mode == "attention-layout":
        attention_layout()
    else:
        int8_rows()
    return 0


if __name__ == "__main__":
    sys.exit(main())
