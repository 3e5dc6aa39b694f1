"""Per-step cost of MinerU2.5's decoder by dtype and batch rows: why batching and int8 pay.

A slice of the real decoder (Qwen2 width: hidden 896, FFN 4,864, 14/2 heads; `--layers` of the
24 layers, default 4) plus the full 151,936-token lm_head, random weights, prepared by the
engine's own recipes (decoder_precision.prepare_decoder): bf16; weight-only int8 (`int8`:
bf16 activations into torch's int8 kernel, the lm_head kept in bf16; what `auto` runs where
bf16 is emulated); the same with the head int8 or fp32, or with fp32 activations; the lossy
dynamic int8 (`int8-dynamic`); fp32. Measures one decode step for 1, 4, 8 and 16 rows
(best of 6 steps after a 64-token prompt) and one prefill of `--prefill` tokens (best of 3;
logits for the last position only, as generate() asks). Seconds here are for the slice:
multiply by 24 / layers for the decoder part of a real step (the lm_head is included once
either way). `--shape` reads the real layer sizes from shape.json (default: built in).

    python bench/bench_decoder_steps.py [--threads 1] [--layers 4] [--prefill 1024]
    MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 \\
        python bench/bench_decoder_steps.py
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

# name -> (decoder recipe, int8 kernel activation dtype, lm_head kept in (None: quantised))
KINDS: dict[str, tuple[str, str, str | None]] = {
    "bf16": ("bfloat16", "bfloat16", None),
    "int8": ("int8", "bfloat16", "bfloat16"),
    "int8 head-int8": ("int8", "bfloat16", None),
    # The bf16 head as one bf16 GEMM for every row count (before it was widened where bf16
    # is emulated: see int8_linear.KeptHead).
    "int8 head-unwidened": ("int8", "bfloat16", "bfloat16"),
    "int8 head-fp32": ("int8", "bfloat16", "float32"),
    "int8 fp32-act": ("int8", "float32", "bfloat16"),
    "int8-dynamic": ("int8-dynamic", "bfloat16", None),
    "fp32": ("float32", "bfloat16", None),
}


def variant(base: Any, kind: str) -> Any:
    from daemon.common.cpus import native_bf16
    from daemon.engines.mineru.runtimes.decoder_precision import CAUSAL_LM, prepare_decoder

    model = copy.deepcopy(base)
    recipe, activations, head = KINDS[kind]
    dense = "bfloat16" if native_bf16() else "float32"
    prepare_decoder(
        model,
        CAUSAL_LM,
        recipe,
        dense_dtype=dense,
        activation_dtype=activations,
        head_dtype=head,
    )
    if kind == "int8 head-unwidened":
        model.lm_head.widen_rows = False
    return model


def decode_step(model: Any, rows: int, repeat: int = 6) -> float:
    import torch

    with torch.inference_mode():
        out = model(input_ids=torch.randint(0, 150_000, (rows, 64)), use_cache=True)
        cache = out.cache
        token = torch.randint(0, 150_000, (rows, 1))
        best = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter()
            out = model(input_ids=token, cache=cache, use_cache=True)
            cache = out.cache
            best = min(best, time.perf_counter() - t0)
    return best


def prefill(model: Any, tokens: int) -> float:
    import torch

    with torch.inference_mode():
        ids = torch.randint(0, 150_000, (1, tokens))
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            model(input_ids=ids, use_cache=True, logits_to_keep=1)
            best = min(best, time.perf_counter() - t0)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--prefill", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=6, help="decode steps, best one kept")
    parser.add_argument("--shape", type=Path, help="shape.json of the real model")
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from daemon.engines.mineru.runtimes.transformers_model import isa_caps

    torch.set_num_threads(args.threads)
    sizes = dict(
        vocab_size=151_936,
        hidden_size=896,
        intermediate_size=4864,
        num_attention_heads=14,
        num_key_value_heads=2,
    )
    if args.shape:
        text = json.loads(args.shape.read_text(encoding="utf-8"))["text_config"]
        sizes = {key: int(text[key]) for key in sizes}
    make_config: Any = Qwen2Config
    config = make_config(**sizes, num_hidden_layers=args.layers, tie_word_embeddings=False)
    torch.manual_seed(0)
    make_model: Any = Qwen2ForCausalLM
    base = make_model(config).eval()
    caps = isa_caps()
    print(
        f"torch kernels {torch.backends.cpu.get_cpu_capability()} {caps or ''}, "
        f"{args.threads} thread(s), {args.layers} layers + lm_head, {sizes}, "
        f"load {os.getloadavg()[0]:.2f}"
    )
    print(f"| dtype | step, 1 row | 4 rows | 8 rows | 16 rows | prefill {args.prefill} tokens |")
    print("|---|---|---|---|---|---|")
    for kind in args.kinds.split(","):
        model = variant(base, kind)
        steps = [decode_step(model, rows, args.repeat) * 1000 for rows in (1, 4, 8, 16)]
        fill = prefill(model, args.prefill) if args.prefill else float("nan")
        print(
            f"| {kind} | " + " | ".join(f"{ms:.1f} ms" for ms in steps) + f" | {fill:.2f} s |",
            flush=True,
        )
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
